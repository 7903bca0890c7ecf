"""Django signals for every job's life, sent in the process where each step happens.

Producers send ``job_enqueued`` and ``job_cancelled`` (a waiting job cancelled by
``Queue.cancel``); workers send ``job_started``, ``job_finished`` and, by outcome,
``job_failed``, ``job_retrying`` and ``job_cancelled``; whoever sweeps stalled jobs (a worker's
heartbeat or ``runreaper``) sends ``job_stalled``. Arguments are documented in
docs/observability.md.

Cost: every send site checks ``signal.receivers`` (a list attribute) before it builds any
argument, so a project that connects nothing pays one attribute read per job and step. A
receiver runs synchronously in the sending thread (a worker's handler or acker thread): it
must be quick, and an exception it raises is logged, never allowed to fail the job or its
verdict (``send_robust``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_jobq.signals")

#: queue, job_id, outcome ("queued", "duplicate", "completed", "updated", "pending").
job_enqueued = Signal()
#: queue, job_id, attempt, worker_id: the worker claimed the job and hands it to its pool.
job_started = Signal()
#: queue, job_id, attempt, worker_id, outcome, duration (s), error (dict | None): every verdict.
job_finished = Signal()
#: queue, job_id, attempt, worker_id, error (dict | None): failed for good (no attempt left).
job_failed = Signal()
#: queue, job_id, attempt, worker_id, error (dict | None), delay (s until the next attempt).
job_retrying = Signal()
#: queue, job_id, failed (bool: stalled past max_stalls), worker_id (None from the reaper).
job_stalled = Signal()
#: queue, job_id, worker_id (None when a waiting job was cancelled by ``Queue.cancel``).
job_cancelled = Signal()

ALL = (job_enqueued, job_started, job_finished, job_failed, job_retrying, job_stalled,
       job_cancelled)  # fmt: skip


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send to every receiver; a receiver's exception is logged and goes no further: what
    an observer does wrong must not change what happens to the job."""
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "receiver %r of a django_jobq signal raised %s: %s",
                receiver, type(result).__name__, result, exc_info=result,
            )  # fmt: skip


def decode_error(body: bytes | None) -> dict[str, Any] | None:
    """The JSON error record of a verdict (``execution.error_body``) as a dict; decoded only
    when some receiver wants it."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return {"type": "Unknown", "message": body[:4096].decode(errors="replace")}
    return value if isinstance(value, dict) else {"type": "Unknown", "message": str(value)}


def enqueued(sender: Any, queue: str, results: Iterable[Any]) -> None:
    """``job_enqueued`` for each stored result (``StoredEnqueue`` or ``EnqueueResult``)."""
    for result in results:
        send(job_enqueued, sender, queue=queue, job_id=result.job_id,
             outcome=str(result.outcome))  # fmt: skip


def stalled(sender: Any, queue: str, requeued: Sequence[str], failed: Sequence[str],
            worker_id: str | None) -> None:  # fmt: skip
    """``job_stalled`` for the jobs one sweep recovered (requeued) or gave up on (failed)."""
    for ids, gave_up in ((requeued, False), (failed, True)):
        for job_id in ids:
            send(job_stalled, sender, queue=queue, job_id=job_id, failed=gave_up,
                 worker_id=worker_id)  # fmt: skip
