"""The body of a process-pool child: set Django up once, then run jobs one at a time.

A reader thread owns the receiving end of the pipe, so a ``cancel`` (soft timeout, lost lease)
reaches the running handler's flag while the main thread is busy in it. Only the main thread
sends. The child ignores SIGINT/SIGTERM: stopping is the parent's decision (``stop`` message,
or a kill past the grace period), so a Ctrl-C in a terminal does not kill jobs mid-way.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from typing import Any


def child_main(conn: Any, settings_module: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    from ..execution import execute, make_job
    from ..job import ClaimedJob
    from ..registry import registry

    jobs: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
    replies: queue.SimpleQueue[bool] = queue.SimpleQueue()
    current: dict[str, Any] = {}

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone: finish nothing more
                jobs.put(None)
                return
            kind = message[0]
            if kind == "job":
                jobs.put(message[1])
            elif kind == "cancel":
                job = current.get("job")
                if job is not None and job.token == message[1]:
                    job.cancel_event.set()
            elif kind == "reported":
                replies.put(message[1])
            elif kind == "stop":
                jobs.put(None)
                return

    threading.Thread(target=read, name="jobq-child-reader", daemon=True).start()
    conn.send(("ready",))
    while (fields := jobs.get()) is not None:
        claimed = ClaimedJob(*fields)
        job = make_job(claimed, None)

        def report(progress: bytes | None, line: str | None, token: int = claimed.token) -> bool:
            conn.send(("report", token, progress, line))
            return replies.get()

        job.reporter = report
        current["job"] = job
        ack = execute(claimed, registry, job)
        current.pop("job", None)
        conn.send(("ack", ack))
