"""The process pool: one reused child process per slot, for CPU-bound handlers and hard timeouts.

Why a fixed set of children and not a fork per job: Django start-up costs about a second and a
fork per job caps throughput near RQ's (tens of jobs a second). Why ``spawn``: the worker
already runs threads (heartbeat, acker), and forking a threaded process can copy a held lock.

The parent's handler thread for slot ``i`` owns child ``i``: it sends the claimed job, answers
the child's progress reports (so children need no storage connection of their own), forwards
the job's cancel flag (soft timeout, lost lease), and past the hard timeout kills the child and
starts a new one. The heartbeat and every other slot keep running meanwhile: a CPU-bound or
hung handler holds only its own child's GIL.

Messages on each duplex pipe (pickled by multiprocessing; they carry only our own tuples and
the payload *bytes*, never a decoded payload):
parent → child: ("run", [ClaimedJob fields, ...]) | ("call", "module:function", token, args)
                | ("cancel", token) | ("reported", ok) | ("stop",)
child → parent: ("ready",) | ("report", token, progress, line) | ("acks", [Ack, ...] | result)
A "run" carries one job, or up to ``batch`` jobs of one queue for a batch handler; a "call"
runs one piece of work that is not a job (a broadcast delivery, ``call()``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from dataclasses import astuple
from typing import Any

from ...errors import HardTimeout
from ...job import ClaimedJob, Job
from ...storage.base import Ack
from ...tasks.registry import HandlerRegistry
from ..execution import error_verdict, job_timeouts
from .child import child_main

logger = logging.getLogger("django_jobq.worker")
POLL = 0.05  # s: how soon a cancel flag or a hard timeout is noticed
READY_TIMEOUT = 60.0  # s a new child may take to set up Django


class ChildDied(Exception):  # noqa: N818 - names what happened to the attempt
    """The child process running the attempt exited (crash, OOM kill, os._exit)."""


class _Child:
    def __init__(self, ctx: Any, slot: int) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        settings = os.environ.get("DJANGO_SETTINGS_MODULE", "")
        self.process = ctx.Process(
            target=child_main, args=(child_conn, settings), name=f"jobq-child-{slot}", daemon=True
        )
        self.process.start()
        child_conn.close()
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(READY_TIMEOUT):
            raise ChildDied(f"child {self.process.pid} did not start within {READY_TIMEOUT}s")
        message = self.conn.recv()
        if message != ("ready",):
            raise ChildDied(f"child {self.process.pid} sent {message!r} instead of ready")
        self.ready = True

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class ProcessRunner:
    supports_hard_timeout = True

    def __init__(self, handlers: HandlerRegistry) -> None:
        self.handlers = handlers  # options only: children run their own registry's handlers
        self._ctx = multiprocessing.get_context("spawn")
        self._children: list[_Child | None] = []
        self._running: dict[int, set[tuple[str, str, int]]] = {}  # slot -> jobs it runs now

    def start(self, slots: int) -> None:
        self._children = [_Child(self._ctx, slot) for slot in range(slots)]

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._children if c is not None and c.process.pid]

    def _child(self, slot: int) -> _Child:
        child = self._children[slot]
        if child is None or not child.process.is_alive():
            if child is not None:
                child.kill()
            child = self._children[slot] = _Child(self._ctx, slot)
        child.wait_ready()
        return child

    def _replace(self, slot: int) -> None:
        child = self._children[slot]
        if child is not None:
            child.kill()
        self._children[slot] = _Child(self._ctx, slot)

    def is_ready(self, slot: int) -> bool:
        child = self._children[slot] if slot < len(self._children) else None
        return child is not None and child.ready and child.process.is_alive()

    def ready(self, slot: int) -> None:
        """Wait until this slot's child is up. The slot's handler thread calls this before it
        takes its next job, so that a child restarting after a crash or a hard timeout (about
        a second of Django start-up) delays no job: the other slots take them meanwhile."""
        if slot >= len(self._children):  # stopped: the worker is shutting down
            return
        try:
            self._child(slot)
        except (ChildDied, EOFError, OSError) as exc:  # run_batch starts another and reports
            logger.error("the child process of slot %d did not start: %s", slot, exc)
            self._replace(slot)

    def run(self, slot: int, claimed: ClaimedJob, job: Job) -> Ack:
        return self.run_batch(slot, [claimed], [job])[0]

    def run_batch(self, slot: int, claimed: list[ClaimedJob], jobs: list[Job]) -> list[Ack]:
        hard = job_timeouts(claimed[0].queue, self.handlers, jobs[0].meta)[1]
        label = f"[{claimed[0].queue}/{','.join(c.job_id for c in claimed)[:200]}]"
        self._running[slot] = {(c.queue, c.job_id, c.token) for c in claimed}
        try:
            child = self._child(slot)
            child.conn.send(("run", [astuple(c) for c in claimed]))
            by_token = {c.token: job for c, job in zip(claimed, jobs, strict=True)}
            return self._converse(child, by_token, hard)
        except HardTimeout as exc:
            logger.warning("%s killed: %s", label, exc)
            self._replace(slot)
            return [error_verdict(c, exc, label) for c in claimed]
        except (ChildDied, EOFError, OSError) as exc:
            died = exc if isinstance(exc, ChildDied) else ChildDied(f"child pipe closed: {exc}")
            logger.error("%s the child process running it died: %s", label, died)
            self._replace(slot)
            return [error_verdict(c, died, label) for c in claimed]
        finally:
            self._running.pop(slot, None)

    def call(self, slot: int, target: str, job: Job, args: Any, hard: float | None) -> Any:
        """Run ``target(args, report, cancel_event)`` (``"module:function"``) in the slot's
        child, as a job is run: ``job``'s cancel flag is forwarded, its reporter answers the
        child's progress reports, and past ``hard`` seconds the child is killed. Returns the
        function's result; raises ``HardTimeout`` or ``ChildDied`` (the slot then has a new
        child starting), for the caller to turn into its own verdict."""
        try:
            child = self._child(slot)
            child.conn.send(("call", target, job.token, args))
            return self._converse(child, {job.token: job}, hard)
        except (HardTimeout, ChildDied, EOFError, OSError) as exc:
            self._replace(slot)
            if isinstance(exc, HardTimeout | ChildDied):
                raise
            raise ChildDied(f"child pipe closed: {exc}") from exc

    def kill(self, key: tuple[str, str, int]) -> None:
        """Kill the child running this job (``Queue.cancel(..., force=True)``); its handler
        thread sees the child die, starts a new one and reports the attempt's end."""
        for slot, keys in list(self._running.items()):
            child = self._children[slot] if slot < len(self._children) else None
            if key in keys and child is not None and child.process.is_alive():
                child.process.kill()

    def _converse(self, child: _Child, by_token: dict[int, Job], hard: float | None) -> Any:
        deadline = None if hard is None else time.monotonic() + hard
        cancel_sent: set[int] = set()
        while True:
            if child.conn.poll(POLL):
                message = child.conn.recv()
                if message[0] == "acks":
                    return message[1]
                if message[0] == "report":
                    job = by_token[message[1]]
                    ok = job.reporter(message[2], message[3]) if job.reporter else True
                    child.conn.send(("reported", ok))
                    if not ok:
                        job.cancel_event.set()
                continue
            for token, job in by_token.items():
                if job.cancel_event.is_set() and token not in cancel_sent:
                    child.conn.send(("cancel", token))
                    cancel_sent.add(token)
            if deadline is not None and time.monotonic() >= deadline:
                raise HardTimeout(f"still running after the hard timeout of {hard:g}s")
            if not child.process.is_alive():
                raise ChildDied(f"exit code {child.process.exitcode}")

    def stop(self) -> None:
        """Ask idle children to exit; kill what does not (a child still running a job past the
        grace period: its job was released already)."""
        for child in self._children:
            if child is not None and child.process.is_alive():
                try:
                    child.conn.send(("stop",))
                except OSError:
                    pass
        deadline = time.monotonic() + 2
        for child in self._children:
            if child is not None:
                child.process.join(max(0.0, deadline - time.monotonic()))
                child.kill()
        self._children = []
