"""The kombu bridge: Celery task messages in, durable django_jobq jobs out.

Order of operations per message, which is the whole point: enqueue into our storage first,
acknowledge the broker message only once that enqueue has returned. A bridge that dies in
between leaves the message unacknowledged, the broker redelivers it, and the enqueue of the same
Celery id is a duplicate (ids deduplicate), so nothing is lost and nothing runs twice because of
the bridge.

A message that cannot run (not JSON, not a task message, a task nothing here handles) is not
dropped and does not block the stream: it is stored as a job on the unroutable queue (no handler
serves it) with the reason and the raw body, for an operator to inspect, and then acknowledged.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ...errors import JobQError
from ...queue.core import Queue
from ...storage.base import Storage
from . import celery_settings, max_attempts_for, route_for
from .protocol import MalformedMessage, job_id_for, parse

logger = logging.getLogger("django_jobq.celery")


class KombuBridge:
    """Consumes Celery queues on a kombu broker (AMQP, Redis transport, …) into django_jobq."""

    def __init__(
        self,
        broker_url: str,
        celery_queues: Sequence[str] | str = ("celery",),
        *,
        storage: Storage | None = None,
        prefetch: int | None = None,
        unroutable_queue: str | None = None,
    ) -> None:
        conf = celery_settings()
        self.broker_url = broker_url
        self.celery_queues = (
            [celery_queues] if isinstance(celery_queues, str) else list(celery_queues)
        )
        self.storage = storage
        self.prefetch = prefetch or conf["PREFETCH"]
        self.unroutable = unroutable_queue or conf["UNROUTABLE_QUEUE"]
        self._queues: dict[str, Queue] = {}
        self._stop = threading.Event()
        self.counts = {"queued": 0, "duplicate": 0, "unroutable": 0, "requeued": 0}
        self.ready = threading.Event()  # set once consuming (tests and the worker's log)

    def _queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = Queue(name, storage=self.storage)
        return q

    # -- one message ----------------------------------------------------------------------

    def handle(self, body: Any, headers: dict | None, content_type: str | None) -> str:
        """Store one message as a job; returns "queued", "duplicate" or "unroutable". Raises
        only when the storage itself failed (then the message must not be acknowledged)."""
        try:
            task = parse(body, headers, content_type)
        except MalformedMessage as exc:
            # Keep the Celery id when the headers carry one: a redelivery is then one record.
            task_id = (headers or {}).get("id")
            task_id = task_id if isinstance(task_id, str) and task_id else None
            return self._quarantine(body, headers, content_type, str(exc), task_id)
        route = route_for(task.task)
        if route is None:
            reason = f"no handler for Celery task {task.task!r} (see @celery_task, CELERY ROUTES)"
            return self._quarantine(body, headers, content_type, reason, task.id)
        queue_name, max_retries = route
        queue = self._queue(queue_name)
        payload = {"args": task.args, "kwargs": task.kwargs, "celery": task.meta()}
        try:
            result = queue.enqueue(
                task.job_id,
                payload,
                run_at=task.eta,
                max_attempts=max_attempts_for(queue_name, max_retries, task.retries),
            )
        except JobQError as exc:  # refused at the edge (payload too large, …): keep it aside
            return self._quarantine(body, headers, content_type, str(exc), task.id)
        logger.debug("[%s/%s] %s from Celery task %s", queue_name, task.job_id, result.outcome,
                     task.task)  # fmt: skip
        return "queued" if result.outcome == "queued" else "duplicate"

    def _quarantine(
        self,
        body: Any,
        headers: dict | None,
        content_type: str | None,
        reason: str,
        task_id: str | None = None,
    ) -> str:
        raw = body if isinstance(body, bytes) else str(body).encode()
        keep = {
            "reason": reason,
            "content_type": content_type,
            "headers": {k: str(v)[:1024] for k, v in (headers or {}).items()},
            "body_base64": base64.b64encode(raw[: 512 * 1024]).decode(),
        }
        job_id = job_id_for(task_id) if task_id else None
        self._queue(self.unroutable).enqueue(job_id, keep)
        logger.error("Celery message kept on %r, not run: %s", self.unroutable, reason)
        return "unroutable"

    # -- consuming --------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Consume until ``stop()``; reconnects after broker errors with a capped backoff."""
        delay = 0.5
        while not self._stop.is_set():
            try:
                self._consume()
                delay = 0.5
            except Exception as exc:  # a broker restart must not end the bridge
                self.ready.clear()
                if self._stop.is_set():
                    break
                logger.warning("kombu bridge: %s: %s; reconnecting in %.1fs",
                               type(exc).__name__, exc, delay)  # fmt: skip
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)

    def _consume(self) -> None:
        from kombu import Connection, Exchange
        from kombu import Queue as KombuQueue

        with Connection(self.broker_url, heartbeat=30) as conn:
            conn.ensure_connection(max_retries=3)
            # Declared the way Celery declares its queues, so an existing queue is reused.
            queues = [KombuQueue(n, Exchange(n, type="direct"), routing_key=n)
                      for n in self.celery_queues]  # fmt: skip
            with conn.Consumer(queues, on_message=self._on_message, no_ack=False,
                               prefetch_count=self.prefetch):  # fmt: skip
                logger.info("kombu bridge consuming %s on %s", self.celery_queues,
                            conn.as_uri())  # fmt: skip
                self.ready.set()
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=0.5)
                    except TimeoutError:  # nothing arrived: keep the AMQP heartbeat alive
                        conn.heartbeat_check()

    def _on_message(self, message: Any) -> None:
        try:
            outcome = self.handle(message.body, message.headers, message.content_type)
        except Exception as exc:  # storage down: give the message back, slow down, go on
            self.counts["requeued"] += 1
            logger.error("kombu bridge: could not store a message (%s: %s); returned it to the "
                         "broker", type(exc).__name__, exc)  # fmt: skip
            message.requeue()
            time.sleep(0.5)
            return
        message.ack()  # only now: the job is durably in our storage
        self.counts[outcome] += 1


def bridge_thread(bridge: KombuBridge) -> threading.Thread:
    thread = threading.Thread(target=bridge.run, name="jobq-kombu-bridge", daemon=True)
    thread.start()
    return thread
