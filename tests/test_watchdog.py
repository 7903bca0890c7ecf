"""The worker's one timer thread (soft timeouts, and the looks that pass an idle wait on when
the lone job run before it has gone on for ``PASS_ON_AFTER``). It wakes only when a new
deadline comes first, so these check that a deadline is never slept past because of that."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from django_jobq.worker.pools.watchdog import Watchdog

from .helpers import wait_until


def asleep(dog: Watchdog) -> bool:
    """Whether the watchdog's thread is parked in its condition wait (its stack, looked at
    from outside): the state in which only a notify or its deadline wakes it."""
    thread = dog._thread
    frame = sys._current_frames().get(thread.ident) if thread is not None else None
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("threading.py"):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def dog() -> Iterator[Watchdog]:
    watchdog = Watchdog()
    yield watchdog
    watchdog.stop()


def test_an_earlier_deadline_scheduled_after_a_later_one_fires_without_waiting_for_it(dog):
    # Arrange: the thread asleep until a deadline an hour away.
    late, early = threading.Event(), threading.Event()
    dog.schedule(3600, late.set)
    assert wait_until(lambda: asleep(dog), 30)
    # Act: a deadline before it.
    dog.schedule(0.01, early.set)
    # Assert: it fires (the thread was woken for it), the late one has not.
    assert early.wait(30)
    assert not late.is_set()


def test_a_later_deadline_does_not_delay_or_drop_an_earlier_one(dog):
    fired: list[str] = []
    done = threading.Event()
    dog.schedule(0.05, lambda: (fired.append("first"), done.set()))
    assert wait_until(lambda: asleep(dog), 30)
    for i in range(100):  # no wake-up for any of these: each comes after the first
        dog.schedule(3600 + i, lambda: fired.append("late"))
    assert done.wait(30)
    assert fired == ["first"]


def test_cancelled_callbacks_never_run_and_the_rest_run_in_deadline_order(dog):
    fired: list[int] = []
    done = threading.Event()
    handles = {i: dog.schedule(0.01 * (10 - i), lambda i=i: fired.append(i)) for i in range(10)}
    for i in (1, 4, 7):
        dog.cancel(handles[i])
    dog.schedule(0.2, done.set)  # after every other deadline
    assert done.wait(30)
    assert fired == [9, 8, 6, 5, 3, 2, 0]


def test_cancelling_the_first_deadline_lets_the_next_one_fire_on_its_own(dog):
    # A cancelled first deadline is only dropped when the thread next wakes; the deadline
    # behind it must still fire.
    second = threading.Event()
    first = dog.schedule(0.02, lambda: None)
    dog.schedule(0.05, second.set)
    dog.cancel(first)
    assert second.wait(30)


def test_a_cancel_after_the_callback_fired_keeps_nothing(dog):
    # A job that ends just past its deadline cancels a timer that already fired: one such
    # cancel per job must not pile up in the watchdog.
    fired = threading.Event()
    handle = dog.schedule(0.001, fired.set)
    assert fired.wait(30)
    dog.cancel(handle)
    assert not dog._live and not dog._heap
