"""SIGTERM and SIGINT for the long-running commands (``runworker``, ``runreaper``,
``runmirror``), acted on by a relay thread instead of inside the Python-level handler.

Why: that handler runs on the main thread only, when the main thread next executes Python
code. A worker's main thread spends its idle time in one lock wait without a timeout (the
fetcher waiting for its idle wait to come back, which on a quiet queue it does not while the
worker runs). A signal that lands just before that wait begins (between the interpreter's last
check for signals and the system call that blocks) is noted by the interpreter's C handler
and nothing else (as is a signal the kernel gives to another thread): the wait is not
interrupted, the Python handler never runs, and the worker ignores the SIGTERM for good. A
CI run of the installed wheel caught that (the smoke check sends SIGTERM as the job's result
comes back, which is when the fetcher is entering that wait); reproduced here 2 times in about
1,900 runs, with the main thread parked in that wait and no signal pending. Running the stop
inside the handler had a second hazard: it sends a Redis command and sets events, and if
the main thread was interrupted holding a lock the stop needs (redis-py 5's connection pool
guards itself with a plain ``threading.Lock``; every ``threading.Event`` has one too), the
handler would wait for its own thread for ever.

So the interpreter's C handler writes the signal's number to a pipe (``signal.set_wakeup_fd``:
at once, in whichever thread received the signal, no Python lock), and a thread that owns
nothing else reads it and calls the command's stop. A second signal is relayed the same way
(a worker's "hurry").
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

logger = logging.getLogger("django_jobq.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long leaving the block waits for the relay to finish a stop it is running (one Redis
# command with its timeout, at most): the stop it runs must not be cut off by the process
# exiting, nor hold the exit up when the storage hangs.
RELAY_JOIN_SECONDS = 10.0


@contextlib.contextmanager
def relayed(
    on_signal: Callable[[int], object], signals: Sequence[int] = STOP_SIGNALS
) -> Iterator[threading.Thread]:
    """Within the block, each of ``signals`` calls ``on_signal(signum)`` on a relay thread
    (yielded, for tests), in the order the signals came. The previous handlers (and wake-up
    fd) are restored on leaving. Must be entered on the main thread (as ``signal.signal``
    requires)."""
    # Off the main thread this raises ValueError, as signal.signal would, before anything
    # is made that would need undoing.
    previous_fd = signal.set_wakeup_fd(-1)
    read_fd, write_fd = os.pipe()
    # A full pipe (64 Ki unread signals) must not block the interpreter's C handler: the
    # relay is behind on stops it will run anyway, so the signal is dropped instead.
    os.set_blocking(write_fd, False)
    wanted = frozenset(int(sig) for sig in signals)
    thread = threading.Thread(
        target=_relay, args=(read_fd, wanted, previous_fd, on_signal), name="jobq-signals",
        daemon=True,
    )  # fmt: skip
    thread.start()
    previous: dict[int, Any] = {}
    try:
        # The wake-up fd first: from the moment a handler below is in place, a signal must
        # reach the pipe (before, it still has its old disposition).
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in signals:
            previous[sig] = signal.signal(sig, _noted)
        yield thread
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)  # the relay reads what is left, then the end of the pipe, and ends
        thread.join(RELAY_JOIN_SECONDS)


def _noted(signum: int, frame: Any) -> None:
    """The Python-level handler: nothing to do. Installing one is what makes the
    interpreter's C handler write the signal's number to the wake-up fd, and that write is
    the message: it happens in whichever thread the kernel delivered the signal to, at once,
    while this function runs only when the main thread next executes Python code (which a
    main thread blocked in a lock wait may not do for a long time)."""


def _relay(
    read_fd: int, wanted: frozenset[int], forward_fd: int, on_signal: Callable[[int], object]
) -> None:
    try:
        while data := os.read(read_fd, 64):
            for signum in data:
                if signum not in wanted:
                    # Another handled signal (the wake-up fd reports every one): its byte
                    # goes on to the fd this block replaced (-1: none), as without us.
                    if forward_fd != -1:
                        with contextlib.suppress(OSError):
                            os.write(forward_fd, bytes((signum,)))
                    continue
                try:
                    on_signal(signum)
                except Exception:  # a stop that failed must not end the relay of the next
                    logger.exception("stopping on signal %d failed", signum)
    finally:
        os.close(read_fd)
