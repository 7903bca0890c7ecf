"""The public event feed (``Queue.events`` / ``Queue.aevents``) on every backend."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_jobq.errors import InvalidOption
from django_jobq.queue import Queue


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
