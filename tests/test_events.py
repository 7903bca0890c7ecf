"""The public event feed (``Queue.events`` / ``Queue.aevents``) on every backend."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from django_jobq.errors import EventsLost, InvalidOption
from django_jobq.job import Keep, Retention
from django_jobq.queue import Queue
from django_jobq.storage.memory import MemoryStorage


@pytest.fixture
def q(live_storage) -> Queue:
    return Queue("feed", storage=live_storage)


def run_one(storage, outcome: str = "complete") -> str:
    (job,) = storage.claim("feed", "feed-worker", 1, 60_000).jobs
    if outcome == "complete":
        storage.complete("feed", job.job_id, job.token, b"1")
    else:
        storage.fail("feed", job.job_id, job.token, b'{"message": "no"}', permanent=True)
    return job.job_id


def test_events_lists_each_transition_in_order(q, live_storage):
    q.enqueue("a", 1)
    q.enqueue("b", 2)
    run_one(live_storage)
    run_one(live_storage, "fail")
    seen = [(e.job_id, e.kind) for e in q.events()]
    assert seen == [("a", "queued"), ("b", "queued"), ("a", "active"), ("a", "completed"),
                    ("b", "active"), ("b", "failed")]  # fmt: skip


def test_kinds_filters_and_since_resumes_after_the_last_event_seen(q, live_storage):
    q.enqueue("a", 1)
    run_one(live_storage)
    (done,) = q.events(kinds=["completed"])
    assert (done.job_id, done.kind, done.worker) == ("a", "completed", "feed-worker")
    q.enqueue("b", 2)
    run_one(live_storage, "fail")
    later = list(q.events(since=done.id, kinds={"completed", "failed"}))
    assert [(e.job_id, e.kind) for e in later] == [("b", "failed")]
    assert list(q.events(since=later[-1].id)) == []


def test_pages_are_followed_to_the_end(q):
    q.enqueue_many([(f"j{i}", i) for i in range(25)])
    assert [e.job_id for e in q.events(batch=10)] == [f"j{i}" for i in range(25)]


def test_follow_waits_for_new_events(q, live_storage):
    got: list[str] = []

    def consume():
        for event in q.events(kinds=["completed"], follow=True, wait=0.2):
            got.append(event.job_id)
            return

    reader = threading.Thread(target=consume)
    reader.start()
    q.enqueue("late", 1)
    run_one(live_storage)
    reader.join(20)
    assert got == ["late"]


def test_aevents_gives_the_same_events(q, live_storage):
    q.enqueue("a", 1)
    run_one(live_storage)

    async def collect():
        return [(e.job_id, e.kind) async for e in q.aevents(kinds=["queued", "completed"])]

    assert asyncio.run(collect()) == [("a", "queued"), ("a", "completed")]


@pytest.mark.parametrize("bad", [{"since": "yesterday"}, {"since": 5}, {"kinds": ["done"]},
                                 {"kinds": []}, {"batch": 0}, {"wait": -1}])  # fmt: skip
def test_bad_arguments_are_refused_before_reading(q, bad):
    with pytest.raises(InvalidOption):
        next(iter(q.events(**bad)), None)


# -- a position that is gone: EventsLost, never a silent gap (issue 36) -------------------------


def test_a_reader_of_an_obliterated_queue_is_told_its_events_are_gone(q, live_storage):
    q.enqueue("a", 1)
    q.enqueue("b", 2)
    first, _ = list(q.events())
    q.obliterate(force=True)
    q.enqueue("c", 3)
    with pytest.raises(EventsLost) as lost:
        list(q.events(since=first.id))
    assert (lost.value.queue, lost.value.since) == ("feed", first.id)
    assert [e.job_id for e in q.events()] == ["c"]  # from "0": what is kept


def test_a_database_reader_behind_the_retention_is_told(q, live_storage):
    """The database keeps a job's events as long as its row: a row the retention removed
    takes events a reader behind it has not read."""
    if not hasattr(live_storage, "using"):
        pytest.skip("Redis and memory keep events apart from their records")
    q.set_retention(Retention(completed=Keep(count=1)))
    q.enqueue("a", 1)
    (start,) = q.events()
    q.enqueue("b", 2)
    run_one(live_storage)
    run_one(live_storage)
    live_storage.reap("feed")
    with pytest.raises(EventsLost):
        list(q.events(since=start.id))


def lossy(backend, live_storage):
    """The storage of ``backend`` with an event cap of 5 (Redis: trims whole nodes of 100)."""
    if backend == "memory":
        return MemoryStorage(events_maxlen=5)
    if hasattr(live_storage, "using"):
        pytest.skip("the database has no cap: its loss is the retention's (test above)")
    live_storage.events_maxlen = 5
    return live_storage


def contiguous(seen: list[str], sent: list[str]) -> bool:
    """Whether ``seen`` is one unbroken run of ``sent`` (the start may have been trimmed)."""
    if not seen:
        return True
    k = sent.index(seen[0])
    return seen == sent[k : k + len(seen)]


@examples(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(steps=st.lists(st.tuples(st.integers(0, 160), st.integers(1, 60)), min_size=1, max_size=6))
def test_a_feed_never_reads_past_a_gap(backend, live_storage, steps):
    """Bursts of enqueues (some larger than the cap) between page reads of a reader: whatever
    the cap trimmed, what the reader saw since it last started from "0" is one unbroken run
    of what was sent, and a read to the end without ``EventsLost`` reaches the newest."""
    storage = lossy(backend, live_storage)
    queue = Queue(f"lossy-{uuid.uuid4().hex[:8]}", storage=storage)
    sent: list[str] = []
    seen: list[str] = []
    position = "0"
    for burst, page in steps:
        new = [f"j{len(sent) + i}" for i in range(burst)]
        if new:
            queue.enqueue_many([(i, 0) for i in new])
        sent += new
        try:
            events = storage.read_events(queue.name, position, count=page)
        except EventsLost:
            seen, position = [], "0"  # told: start again from the oldest kept
            continue
        seen += [e.job_id for e in events]
        position = events[-1].id if events else position
        assert contiguous(seen, sent), "a page skipped events"
    try:
        seen += [e.job_id for e in queue.events(since=position)]
    except EventsLost:
        return
    assert contiguous(seen, sent) and (not sent or seen[-1:] == sent[-1:]), seen


# -- Event.data: what a transition carried (issue 36) -------------------------------------------


def test_events_carry_the_result_the_error_and_the_progress(q, live_storage):
    for job_id in ("ok", "flaky", "big", "dead"):
        q.enqueue(job_id, 1, max_attempts=2)
    ok, flaky, big, dead = live_storage.claim("feed", "w", 4, 60_000).jobs
    assert live_storage.report("feed", "ok", ok.token, progress=b'{"done": 0.5}')
    live_storage.complete("feed", "ok", ok.token, b'{"sum": 3, "f": 1e16}')
    live_storage.fail("feed", "flaky", flaky.token, b'{"type": "E", "message": "first"}',
                      retry_in=3_600_000)  # fmt: skip
    live_storage.complete("feed", "big", big.token, b'"' + b"x" * 5000 + b'"')
    live_storage.fail("feed", "dead", dead.token, b'{"type": "E", "message": "no"}',
                      permanent=True)  # fmt: skip
    carried = [(e.job_id, e.kind, e.data, e.data_omitted) for e in q.events()
               if e.kind in ("progress", "completed", "retrying", "failed")]  # fmt: skip
    assert carried == [
        ("ok", "progress", {"done": 0.5}, False),
        ("ok", "completed", {"sum": 3, "f": 1e16}, False),
        ("flaky", "retrying", {"type": "E", "message": "first"}, False),
        ("big", "completed", None, True),  # over EVENT_DATA_MAX: the record has it
        ("dead", "failed", {"type": "E", "message": "no"}, False),
    ]
    assert type(carried[1][2]["f"]) is float  # exactly as it was (PostgreSQL too)
    assert all(e.data is None for e in q.events(kinds=["queued", "active"]))


@pytest.mark.parametrize("n", [1, 3])  # PostgreSQL: a lone completion and a batch differ
def test_batched_completions_carry_their_results(q, live_storage, n):
    from django_jobq.storage.base import Ack

    q.enqueue_many([(f"b{i}", i) for i in range(n)])
    jobs = live_storage.claim("feed", "w", n, 60_000).jobs
    acks = [Ack("complete", j.job_id, j.token, b'{"n": %d}' % i) for i, j in enumerate(jobs)]
    acks[-1] = Ack("complete", jobs[-1].job_id, jobs[-1].token, b"[" + b"1," * 600 + b"1]")
    live_storage.ack_many("feed", acks)
    done = [(e.job_id, e.data, e.data_omitted) for e in q.events(kinds=["completed"])]
    expected = [(j.job_id, {"n": i}, False) for i, j in enumerate(jobs[:-1])]
    assert done == [*expected, (jobs[-1].job_id, None, True)]


def test_the_lua_cap_on_event_data_is_the_python_one():
    from pathlib import Path

    from django_jobq.job import EVENT_DATA_MAX

    common = Path(__file__).parent.parent / "django_jobq/storage/redis/lua/includes/common.lua"
    assert f"local EVENT_DATA_MAX = {EVENT_DATA_MAX}\n" in common.read_text()


def test_an_sse_message_carries_the_data_and_says_when_it_was_left_out():
    import json

    from django_jobq.api.events import message
    from django_jobq.job import Event

    def body(event: Event) -> dict:
        return json.loads(message(event).split("data: ", 1)[1])

    done = body(Event("1-0", "q", "a", "completed", 1, "w", {"sum": 3}))
    assert done["data"] == {"sum": 3} and "data_omitted" not in done
    big = body(Event("2-0", "q", "b", "completed", 2, "w", None, True))
    assert (big["data"], big["data_omitted"]) == (None, True)
    assert body(Event("3-0", "q", "c", "completed", 3, None, {"raw": b"\x00"}))["data"]
