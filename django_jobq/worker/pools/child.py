"""The body of a process-pool child: set Django up once, then run jobs one at a time.

A reader thread owns the receiving end of the pipe, so a ``cancel`` (soft timeout, lost lease)
reaches the running handler's flag while the main thread is busy in it. Only the main thread
sends. The child ignores SIGINT/SIGTERM: stopping is the parent's decision (``stop`` message,
or a kill past the grace period), so a Ctrl-C in a terminal does not kill jobs mid-way.

Besides jobs a child runs ``("call", "module:function", token, args)``: work that is not a
claimed job (a broadcast delivery) but needs the same things of a slot (hard timeout, cancel
flag, progress relayed through the parent). The function gets ``(args, report, cancel_event)``
and returns what goes back in the ``("acks", ...)`` reply; it must not raise.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any


def child_main(conn: Any, settings_module: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    from ...job import ClaimedJob
    from ...tasks.registry import registry
    from ..execution import close_old_connections, execute, execute_batch, make_job

    runs: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
    replies: queue.SimpleQueue[bool] = queue.SimpleQueue()
    current: dict[int, Any] = {}  # token -> Job of the run in progress

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone: finish nothing more
                runs.put(None)
                return
            kind = message[0]
            if kind in ("run", "call"):
                runs.put(message)
            elif kind == "cancel":
                job = current.get(message[1])
                if job is not None:
                    job.cancel_event.set()
            elif kind == "reported":
                replies.put(message[1])
            elif kind == "stop":
                runs.put(None)
                return

    threading.Thread(target=read, name="jobq-child-reader", daemon=True).start()
    conn.send(("ready",))
    while (run := runs.get()) is not None:
        if run[0] == "call":
            from django.utils.module_loading import import_string

            _, target, token, args = run
            current[token] = flag = SimpleNamespace(cancel_event=threading.Event())
            report = partial(_report, conn, replies, token)
            result = import_string(target.replace(":", "."))(args, report, flag.cancel_event)
            current.clear()
            conn.send(("acks", result))
            continue
        claimed = [ClaimedJob(*fields) for fields in run[1]]
        jobs = []
        for c in claimed:
            job = make_job(c, None)
            job.reporter = partial(_report, conn, replies, c.token)
            current[c.token] = job
            jobs.append(job)
        if registry.options(claimed[0].queue).batch:
            acks = execute_batch(claimed, registry, jobs)
        else:
            acks = [execute(claimed[0], registry, jobs[0])]
        close_old_connections()
        current.clear()
        conn.send(("acks", acks))


def _report(conn: Any, replies: queue.SimpleQueue, token: int, progress: Any, line: Any) -> bool:
    """job.set_progress / job.log in a child: the parent stores it and says if the lease held."""
    conn.send(("report", token, progress, line))
    return replies.get()
