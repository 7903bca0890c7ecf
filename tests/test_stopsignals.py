"""Stop signals are acted on by a relay thread, never inside the handler (stopsignals.py).

What these guard against: a Python-level handler runs on the main thread only, when it next
executes Python code, so a main thread blocked in a lock wait may never run it (a worker that
ignored SIGTERM for good); and run between two bytecodes of whatever the main thread was
doing, a stop that needs a lock the main thread holds at that moment (redis-py 5's pool lock,
an Event's lock) waits for itself for ever."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from django_jobq.worker import stopsignals

# Long enough for any loaded machine to run a thread that is ready; a correct relay never
# waits it out (it decides on events), a handler that runs the stop itself always does.
PATIENCE = 20.0


def _kill_self(sig: int) -> None:
    os.kill(os.getpid(), sig)


def test_each_signal_is_relayed_in_order_off_the_main_thread():
    calls: list[tuple[int, str]] = []
    both = threading.Event()

    def on_signal(signum: int) -> None:
        calls.append((signum, threading.current_thread().name))
        if len(calls) == 2:
            both.set()

    with stopsignals.relayed(on_signal) as relay:
        _kill_self(signal.SIGTERM)
        _kill_self(signal.SIGINT)
        assert both.wait(PATIENCE)
    assert calls == [(signal.SIGTERM, "jobq-signals"), (signal.SIGINT, "jobq-signals")]
    assert relay.name == "jobq-signals"
    assert not relay.is_alive()  # leaving the block ends the relay


def test_a_stop_needing_a_lock_the_main_thread_holds_waits_for_it_instead_of_deadlocking():
    lock = threading.Lock()  # not reentrant, as redis-py 5's pool lock
    entered = threading.Event()
    outcome: list[tuple[bool, bool]] = []

    def on_signal(signum: int) -> None:
        entered.set()
        got = lock.acquire(timeout=PATIENCE)
        outcome.append((got, threading.current_thread() is threading.main_thread()))
        if got:
            lock.release()

    with stopsignals.relayed(on_signal) as relay:
        with lock:
            _kill_self(signal.SIGTERM)
            # The handler has run by the time the stop began (in the handler, it would now
            # wait for the lock held right here, on this very thread).
            assert entered.wait(PATIENCE)
        relay.join(0)  # a no-op: the relay goes on until the block ends
    assert outcome == [(True, False)]


def test_a_signal_another_thread_received_is_relayed_while_the_main_thread_blocks():
    # The kernel may deliver a process's SIGTERM to any thread. The main thread, blocked in a
    # lock wait, is not woken by a signal another thread received, so a stop that waited for
    # the Python-level handler (which runs on the main thread only) would wait with it.
    stopped = threading.Event()
    main = Path(f"/proc/self/task/{threading.main_thread().native_id}/stat")

    def deliver_to_myself_once_main_sleeps() -> None:
        # The event to wait for: the main thread asleep (in the lock wait below).
        while main.read_text().rpartition(")")[2].split()[0] != "S":
            time.sleep(0.001)  # polling a condition, not pacing the test
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    with stopsignals.relayed(lambda _: stopped.set()):
        other = threading.Thread(target=deliver_to_myself_once_main_sleeps, daemon=True)
        other.start()
        assert stopped.wait(PATIENCE)  # one lock wait on the main thread, ended by the relay
        other.join()


def test_other_signals_go_on_to_the_wake_up_fd_the_block_replaced():
    theirs_r, theirs_w = os.pipe()
    os.set_blocking(theirs_w, False)
    previous_fd = signal.set_wakeup_fd(theirs_w)
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    try:
        seen: list[int] = []
        with stopsignals.relayed(seen.append):
            _kill_self(signal.SIGUSR1)
            _kill_self(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        assert os.read(theirs_r, 16) == bytes((signal.SIGUSR1,))
        assert signal.set_wakeup_fd(theirs_w) == theirs_w  # theirs again after the block
    finally:
        signal.signal(signal.SIGUSR1, before)
        signal.set_wakeup_fd(previous_fd)
        os.close(theirs_r)
        os.close(theirs_w)


def test_previous_handlers_come_back_after_the_block():
    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    before = signal.signal(signal.SIGTERM, mine)
    # Not assumed to be Python's default: a shell's background job starts with SIGINT ignored.
    sigint_before = signal.getsignal(signal.SIGINT)
    try:
        with stopsignals.relayed(lambda _: None):
            assert signal.getsignal(signal.SIGTERM) is not mine
            assert signal.getsignal(signal.SIGINT) is not sigint_before
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is sigint_before
        assert signal.set_wakeup_fd(-1) == -1  # none before the block, none after
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_that_raises_is_logged_and_the_next_signal_still_relayed(caplog):
    seen: list[int] = []
    second = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append(signum)
        if len(seen) == 1:
            raise RuntimeError("storage down")
        second.set()

    with caplog.at_level("ERROR", logger="django_jobq.worker"):
        with stopsignals.relayed(on_signal):
            _kill_self(signal.SIGTERM)
            _kill_self(signal.SIGTERM)
            assert second.wait(PATIENCE)
    assert seen == [signal.SIGTERM, signal.SIGTERM]
    assert "stopping on signal 15 failed" in caplog.text


def test_only_the_signals_asked_for_are_taken():
    sigint_before = signal.getsignal(signal.SIGINT)
    with stopsignals.relayed(lambda _: None, [signal.SIGTERM]):
        assert signal.getsignal(signal.SIGINT) is sigint_before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_right_at_the_end_of_the_block_is_not_lost(sig):
    seen: list[int] = []
    with stopsignals.relayed(seen.append):
        _kill_self(sig)
    # Leaving the block lets the relay read what the handler wrote before the pipe closed.
    assert seen == [sig]


def test_off_the_main_thread_it_refuses_and_leaves_nothing_behind():
    raised: list[BaseException] = []
    relays_before = {t for t in threading.enumerate() if t.name == "jobq-signals"}

    def enter() -> None:
        try:
            with stopsignals.relayed(lambda _: None):
                pass  # pragma: no cover - never entered
        except ValueError as exc:
            raised.append(exc)

    other = threading.Thread(target=enter)
    other.start()
    other.join()
    assert len(raised) == 1
    assert signal.set_wakeup_fd(-1) == -1  # not left set
    relays = {t for t in threading.enumerate() if t.name == "jobq-signals"}
    assert relays == relays_before  # its relay ended with the block
