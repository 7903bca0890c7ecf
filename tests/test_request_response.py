"""Request/response at the round-trip limit (issue 25): ``Storage.enqueue_and_wait`` and
``Storage.wait_and_claim``, on every backend.

Redis sends the enqueue and the BLPOP of the job's reply list in one write, and an idle
worker's claim behind its wake-up BLPOP; the other backends make the two calls (the
database waits on its job's own ``NOTIFY``). What must hold everywhere: a job claimed on
wake-up is leased and fenced like any claim (a worker that dies holding it loses it to the
reaper), a stopping worker claims nothing, a waiter gets the job's true ending (completed,
failed, cancelled, a finished duplicate at once), and a wait that times out leaves nothing
behind. Every test decides on events (``wait_until``), never on sleeps.
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobq import Queue
from django_jobq.errors import JobFailed, Timeout
from django_jobq.job import AckOutcome, JobOptions, NewJob
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import PATIENCE, PROCESS_START, Spawner, wait_until

Q = "rr"
LEASE = 5_000


def in_thread(fn, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; its return value or exception lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def waiting_job(job_id: str, storage) -> NewJob:
    return NewJob(job_id, b'{"n": 1}', JobOptions(), None, 0, "json", True)


def registered(storage, job_id: str) -> bool:
    record = storage.get_record(Q, job_id)
    return record is not None


# -- a worker that claims as it wakes -----------------------------------------------------------


def test_a_worker_woken_by_an_enqueue_gets_the_job_leased_and_a_dead_one_loses_it(storage, clock):
    """The job claimed on wake-up is active under the waiting worker's lease and token; the
    worker then "dies" (never answers): once its lease passes, the reaper puts the job back
    and the next claim fences the old token off."""
    thread, out = in_thread(storage.wait_and_claim, Q, "w1", 4, LEASE, PATIENCE)
    Queue(Q, storage=storage).enqueue("j1", {"n": 1})
    thread.join(PATIENCE)
    assert not thread.is_alive() and "error" not in out, out
    batch = out["value"]
    if batch is None:  # a backend that only waits: the caller claims itself
        batch = storage.claim(Q, "w1", 4, LEASE)
    assert [j.job_id for j in batch.jobs] == ["j1"]
    first = batch.jobs[0]
    record = storage.get_record(Q, "j1")
    assert record.state is JobState.ACTIVE and record.worker == "w1" and record.attempts == 1

    clock.advance(LEASE + 1)
    report = storage.reap(Q)
    assert report.requeued == ["j1"]
    again = storage.claim(Q, "w2", 1, LEASE)
    assert [j.job_id for j in again.jobs] == ["j1"] and again.jobs[0].token > first.token
    assert storage.complete(Q, "j1", first.token, b"1") is AckOutcome.LEASE_LOST
    assert storage.complete(Q, "j1", again.jobs[0].token, b"2") is AckOutcome.COMPLETED


def test_a_stopping_worker_claims_nothing_on_waking(storage):
    """interrupt_wait (shutdown) ends the wait, and the claim behind it takes no job, even
    with one waiting: a worker being stopped must not start work."""
    Queue(Q, storage=storage).enqueue("j1", {"n": 1})
    storage.interrupt_wait([Q], "w1")
    batch = storage.wait_and_claim(Q, "w1", 4, LEASE, PATIENCE)
    assert batch is None or batch.jobs == []
    assert storage.get_record(Q, "j1").state is JobState.QUEUED


def test_a_wait_that_times_out_still_claims_what_became_due(storage, clock):
    """The claim runs when the wait ends by its timeout too: a scheduled job that is due by
    then is promoted and claimed in the same step (the worker's timed wait for it)."""
    Queue(Q, storage=storage).enqueue("later", {"n": 1}, delay=100)
    first = storage.wait_and_claim(Q, "w1", 4, LEASE, 0.05)  # (takes the enqueue's wake-up)
    assert first is None or first.jobs == []
    clock.advance(100)
    batch = storage.wait_and_claim(Q, "w1", 4, LEASE, 0.05)  # no wake-up left: times out
    if batch is None:
        batch = storage.claim(Q, "w1", 4, LEASE)
    assert [j.job_id for j in batch.jobs] == ["later"]


# -- the waiter's answer -------------------------------------------------------------------------


def test_a_waiter_gets_the_result_of_its_job(live_storage):
    queue = Queue(Q, storage=live_storage)
    thread, out = in_thread(queue.enqueue_and_wait, "j1", {"n": 1}, timeout=PATIENCE)
    assert wait_until(lambda: registered(live_storage, "j1"))
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.complete(Q, "j1", claimed.token, b'{"ok": 7}')
    thread.join(PATIENCE)
    assert out == {"value": {"ok": 7}}


def test_a_waiter_whose_job_is_cancelled_hears_it(live_storage):
    queue = Queue(Q, storage=live_storage)
    thread, out = in_thread(queue.enqueue_and_wait, "j1", {"n": 1}, timeout=PATIENCE)
    assert wait_until(lambda: registered(live_storage, "j1"))
    queue.cancel("j1")
    thread.join(PATIENCE)
    assert isinstance(out.get("error"), JobFailed) and out["error"].state == "cancelled"


def test_a_waiter_whose_job_fails_for_good_gets_the_error(live_storage):
    queue = Queue(Q, storage=live_storage)
    thread, out = in_thread(queue.enqueue_and_wait, "j1", {"n": 1}, timeout=PATIENCE)
    assert wait_until(lambda: registered(live_storage, "j1"))
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    error = b'{"type": "ValueError", "message": "bad input"}'
    live_storage.fail(Q, "j1", claimed.token, error, permanent=True)
    thread.join(PATIENCE)
    failure = out.get("error")
    assert isinstance(failure, JobFailed) and failure.state == "failed"
    assert "bad input" in str(failure.error)


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_a_finished_duplicate_answers_at_once_and_the_client_stays_usable(live_storage, ending):
    """(Redis: the BLPOP sent behind the enqueue is dropped with its connection; the next
    calls must not read its reply.)"""
    queue = Queue(Q, storage=live_storage)
    queue.enqueue("j1", {"n": 1})
    if ending == "cancelled":
        queue.cancel("j1")
    else:
        claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
        if ending == "completed":
            live_storage.complete(Q, "j1", claimed.token, b"5")
        else:
            live_storage.fail(Q, "j1", claimed.token, b'{"message": "x"}', permanent=True)
    for _ in range(3):
        if ending == "completed":
            assert queue.enqueue_and_wait("j1", {"n": 1}, timeout=PATIENCE) == 5
        else:
            with pytest.raises(JobFailed) as info:
                queue.enqueue_and_wait("j1", {"n": 1}, timeout=PATIENCE)
            assert info.value.state == ending
        assert queue.get_status("j1").state.value == ending


def test_a_wait_that_times_out_leaves_no_reply_behind(live_storage):
    """The timed-out waiter withdraws itself: the job's later completion pushes no reply that
    nobody reads (Redis: no reply list), and a new waiter gets the result at once."""
    queue = Queue(Q, storage=live_storage)
    with pytest.raises(Timeout):
        queue.enqueue_and_wait("j1", {"n": 1}, timeout=0.05)
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.complete(Q, "j1", claimed.token, b"3")
    if isinstance(live_storage, RedisStorage):
        keys = live_storage.keys(Q)
        assert live_storage.client.exists(keys.done("j1")) == 0
        assert live_storage.client.hget(keys.job("j1"), "waiters") in (None, b"0")
    assert queue.enqueue_and_wait("j1", {"n": 1}, timeout=PATIENCE) == 3


def test_an_async_wait_that_times_out_leaves_no_reply_behind(live_storage):
    """``aenqueue_and_wait`` gives up as the sync wait does: withdrawn (on Redis natively, by
    the async client), so the later completion pushes no reply and a new waiter is answered."""
    queue = Queue(Q, storage=live_storage)
    with pytest.raises(Timeout):
        async_to_sync(queue.aenqueue_and_wait)("j1", {"n": 1}, timeout=0.05)
    if isinstance(live_storage, RedisStorage):
        keys = live_storage.keys(Q)
        assert live_storage.client.hget(keys.job("j1"), "waiters") in (None, b"0")
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.complete(Q, "j1", claimed.token, b"3")
    if isinstance(live_storage, RedisStorage):
        assert live_storage.client.exists(keys.done("j1")) == 0
    assert async_to_sync(queue.aenqueue_and_wait)("j1", {"n": 1}, timeout=PATIENCE) == 3


def test_a_waiter_that_gives_up_as_its_job_ends_takes_its_reply(live_storage):
    """The race the withdrawal closes: the job ends between the waiter's last read and its
    withdrawal; the reply pushed for it is taken, so the outcome is not lost and nothing is
    left over."""
    live_storage.enqueue(Q, waiting_job("j1", live_storage))
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.complete(Q, "j1", claimed.token, b"4")
    if isinstance(live_storage, RedisStorage):  # the withdrawal step itself
        outcome = live_storage._unwait(Q, "j1")
    else:
        outcome = live_storage.wait_for_outcome(Q, "j1", 0.001)
    assert outcome is not None and outcome.state is JobState.COMPLETED and outcome.result == b"4"
    if isinstance(live_storage, RedisStorage):
        assert live_storage.client.exists(live_storage.keys(Q).done("j1")) == 0


@pytest.mark.parametrize("size", [10, 20_000], ids=["small", "larger-than-a-notify"])
def test_a_waiter_gets_its_result_whole_whatever_its_size(live_storage, size):
    """(PostgreSQL: a small result rides in its completion's NOTIFY, a large one is read from
    the row; either way the waiter gets every byte, escapes and non-ASCII text included.)"""
    queue = Queue(Q, storage=live_storage)
    thread, out = in_thread(queue.enqueue_and_wait, "j1", {"n": 1}, timeout=PATIENCE)
    assert wait_until(lambda: registered(live_storage, "j1"))
    value = {"text": 'caf\u00e9 \\ "q" \n' + "x" * size}
    claimed = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    body = json.dumps(value).encode()
    assert live_storage.ack_many(Q, [Ack("complete", "j1", claimed.token, body)]) == [
        AckOutcome.COMPLETED
    ]  # as a worker completes (on PostgreSQL the statement that carries the result)
    thread.join(PATIENCE)
    assert out == {"value": value}


# -- waiter bookkeeping, model-based (Redis) ----------------------------------------------------


@pytest.mark.redis
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(st.sampled_from(["join", "give_up", "finish"]), max_size=12))
def test_replies_match_the_waiters_still_registered(redis_client, redis_prefix, steps):
    """Joins (enqueue with a waiter), withdrawals (a timed-out waiter's unwait) and the finish
    in any order: the finish pushes exactly one reply per waiter still registered, each
    withdrawal after it takes one, and none is left once every waiter is done."""
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    job_id = f"m{abs(hash(tuple(steps))) % 10**9}-{len(steps)}"
    keys = storage.keys(Q)
    storage.enqueue(Q, waiting_job(job_id, storage))
    registered_waiters, finished, replies, token = 1, False, 0, None
    for step in [*steps, "finish"] + ["give_up"] * 14:
        if step == "join":
            stored = storage.enqueue(Q, waiting_job(job_id, storage))
            if not finished:
                registered_waiters += 1
            else:
                assert stored.state is JobState.COMPLETED
        elif step == "give_up" and (registered_waiters or replies):
            outcome = storage._unwait(Q, job_id)
            if finished:
                assert outcome is not None and outcome.state is JobState.COMPLETED
                replies -= 1
            else:
                assert outcome is None
                registered_waiters -= 1
        elif step == "finish" and not finished:
            token = storage.claim(Q, "w", 1, LEASE).jobs[0].token
            storage.complete(Q, job_id, token, b"1")
            finished, replies, registered_waiters = True, registered_waiters, 0
        assert redis_client.llen(keys.done(job_id)) == replies
        if not finished:
            assert int(redis_client.hget(keys.job(job_id), "waiters") or 0) == registered_waiters
    assert redis_client.exists(keys.done(job_id)) == 0


# -- the same with real processes (Redis) -------------------------------------------------------


@pytest.fixture
def spawn(redis_prefix, tmp_path):
    spawner = Spawner(
        tmp_path,
        {"JOBQ_TEST_PREFIX": redis_prefix, "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")},
    )
    yield spawner
    spawner.stop_all()


@pytest.mark.redis
@pytest.mark.slow
def test_an_idle_runworker_killed_holding_a_job_claimed_on_wake_up_loses_it_to_the_reaper(
    spawn, redis_client, redis_prefix, tmp_path
):
    """A runworker of one queue, idle (blocked on its wake-up, with its claim behind it), is
    handed a job by the enqueue that wakes it; SIGKILLed while running it, it leaves the job
    active under its lease, and the reaper gives it to the next worker, which finishes it."""
    queue = Queue("tests-slow", storage=RedisStorage(redis_client, prefix=redis_prefix))
    victim = spawn("runworker", "tests-slow", "-c", "2", "--lease", "1000", "--reap-interval", "0")
    assert wait_until(lambda: queue.storage.list_workers(), PROCESS_START), "worker never started"
    ledger = tmp_path / "ledger.txt"
    # Long enough that the victim is killed while it runs, even on a loaded machine.
    queue.enqueue("held", {"seconds": 5, "ledger": str(ledger)}, max_stalls=3)
    assert wait_until(lambda: queue.get_status("held").state is JobState.ACTIVE)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    spawn("runworker", "tests-slow", "-c", "2", "--lease", "1000", "--reap-interval", "0")
    spawn("runreaper", "--interval", "0.2")
    assert wait_until(lambda: queue.get_status("held").state is JobState.COMPLETED, 120)
    assert queue.get_status("held").stalls == 1  # recovered once, from the dead worker
    assert ledger.read_text().split()[::2] == ["held"]  # only the second run reached the end
