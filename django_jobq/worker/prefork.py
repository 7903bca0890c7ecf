"""Pre-fork launcher: set Django up once, then fork N worker processes and supervise them
(``runworker --processes N``), as Celery's prefork pool and gunicorn do.

Why: a ``runworker`` process spends most of its start-up importing Django, the project and
redis-py (0.3-0.5 s of CPU). N separate processes pay that N times, and on a machine with
fewer cores than workers the start-ups queue behind each other, so four of them drained a
small backlog slower than one. Forked children start from the parent's imports (shared
copy-on-write memory) and are serving within milliseconds.

What the parent does, and why:
- Forks before any thread or storage connection exists in it (Django's database connections
  are closed first; each child builds its own storage): a fork copies one thread and no
  socket that another process also reads.
- Each child is a whole worker: its own worker id, registration, heartbeat and leases, so a
  child that dies loses only its own leases, which expire and are recovered like any
  stalled job's (by the other children's sweeps or ``runreaper``).
- A child that exits while the launcher is not stopping is replaced. One that dies within
  ``MIN_UPTIME`` of its start is replaced after a back-off (doubling to ``MAX_BACKOFF``), so
  a child that cannot start does not spin the CPU.
- SIGTERM or SIGINT to the parent is sent on to every child as SIGTERM: the first one is the
  children's graceful stop (finish in-flight work within ``grace``), a second one their
  hurry, as for a single ``runworker``. Children run in their own process group, so a
  terminal's Ctrl-C reaches them once, through the parent, not twice.
- No orphans: a child is told (``PR_SET_PDEATHSIG`` on Linux, else a thread watching its
  parent's pid) to stop gracefully when the parent dies, even by SIGKILL.

The parent waits on a self-pipe (``signal.set_wakeup_fd``) that SIGCHLD, SIGTERM and SIGINT
write to: no polling.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("django_jobq.prefork")

MIN_UPTIME = 1.0  # s: a child that dies sooner is replaced after a back-off
FIRST_BACKOFF = 0.5  # s
MAX_BACKOFF = 10.0  # s
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)


@dataclass(slots=True)
class _Child:
    index: int
    pid: int
    started: float  # monotonic


class Prefork:
    """Run ``serve(index)`` in ``processes`` forked children until told to stop.

    ``serve`` runs in the child and returns its exit status (an exception is logged and
    exits 1); it installs its own signal handlers (``runworker`` does). ``run`` returns the
    launcher's exit status: 0 when every child stopped cleanly after a requested stop.
    """

    def __init__(self, processes: int, serve: Callable[[int], int]) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.processes = processes
        self.serve = serve
        self.children: dict[int, _Child] = {}  # pid -> child
        self.stops = 0  # SIGTERM/SIGINT received
        self.replaced = 0  # children that died unasked and were replaced
        self._backoff: dict[int, float] = {}  # index -> current back-off
        self._due: dict[int, float] = {}  # index -> monotonic time to fork it again
        self._clean = True

    # -- parent ----------------------------------------------------------------------------

    def run(self) -> int:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)
        self._pipe = (read_fd, write_fd)
        # Objects made so far are never collected in the children: a collection there would
        # touch (and so copy) every page the fork shares with the parent.
        gc.freeze()
        try:
            for index in range(self.processes):
                if self.stops:  # a signal while forking: no more children
                    break
                self._fork(index)
            self._supervise(read_fd)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(read_fd)
            os.close(write_fd)
        return 0 if self._clean else 1

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGCHLD:
            return  # the wake-up byte is the message; _reap reads the exits
        self.stops += 1
        if self.stops == 1:
            logger.info("prefork: stopping %d worker(s)", len(self.children))
        self._due.clear()  # nothing is forked again once stopping
        for pid in list(self.children):
            self._kill(pid, signal.SIGTERM)

    def _supervise(self, read_fd: int) -> None:
        while self.children or (self._due and not self.stops):
            self._reap()
            if not self.children and not self._due:
                break
            now = time.monotonic()
            for index, due in sorted(self._due.items()):
                if due <= now and not self.stops:
                    del self._due[index]
                    self._fork(index)
            timeout = None
            if self._due and not self.stops:
                timeout = max(0.0, min(self._due.values()) - time.monotonic())
            try:
                ready, _, _ = select.select([read_fd], [], [], timeout)
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
                ready = []
            if ready:
                try:
                    while os.read(read_fd, 512):
                        pass
                except BlockingIOError:
                    pass

    def _reap(self) -> None:
        """Collect every child that exited; schedule a replacement unless stopping."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue  # not one of ours (e.g. a grandchild re-parented: not here)
            code = os.waitstatus_to_exitcode(status)
            if self.stops:
                if code != 0:
                    self._clean = False
                    logger.warning("prefork: worker %d (pid %d) exited %d while stopping",
                                   child.index, pid, code)  # fmt: skip
                continue
            self.replaced += 1
            lived = time.monotonic() - child.started
            delay = 0.0
            if lived < MIN_UPTIME:
                delay = self._backoff.get(child.index, FIRST_BACKOFF / 2) * 2
                delay = min(delay, MAX_BACKOFF)
                self._backoff[child.index] = delay
            else:
                self._backoff.pop(child.index, None)
            logger.warning(
                "prefork: worker %d (pid %d) exited %d after %.1fs; replacing it%s",
                child.index, pid, code, lived, f" in {delay:.1f}s" if delay else "",
            )  # fmt: skip
            self._due[child.index] = time.monotonic() + delay

    def _fork(self, index: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            self._child(index)  # never returns
        self.children[pid] = _Child(index, pid, time.monotonic())
        logger.debug("prefork: worker %d is pid %d", index, pid)

    @staticmethod
    def _kill(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # already gone; _reap collects it

    # -- child -----------------------------------------------------------------------------

    def _child(self, index: int) -> None:
        code = 1
        try:
            parent = os.getppid()
            signal.set_wakeup_fd(-1)
            for sig in _SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.close(self._pipe[0])
            os.close(self._pipe[1])
            os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the parent only (see the module doc)
            _stop_with_parent(parent)
            code = int(self.serve(index) or 0)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)


def _stop_with_parent(parent: int) -> None:
    """SIGTERM this process (its graceful stop) when ``parent`` is gone."""
    if sys.platform.startswith("linux") and _pdeathsig(signal.SIGTERM):
        if os.getppid() != parent:  # it died before the call above took effect
            os.kill(os.getpid(), signal.SIGTERM)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="jobq-parent-watch", daemon=True).start()


def _pdeathsig(sig: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
