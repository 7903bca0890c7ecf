"""The dead-letter list and retry through the Queue API, with a real worker, on every backend."""

from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError

from django_jobq import DeadLetter, InvalidJobId, InvalidOption, JobState, RetryOutcome
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "dead-api"


@pytest.fixture
def setup(live_storage):
    """A worker whose handler fails every job until ``fixed`` is set."""
    state = {"fixed": False, "ran": []}

    def handle(job):
        state["ran"].append((job.id, job.attempt))
        if not state["fixed"]:
            raise ValueError(f"broken: {job.payload['n']}")
        return job.payload["n"] * 10

    registry = HandlerRegistry()
    registry.register(Q, handle)
    worker = Worker([Q], storage=live_storage, handlers=registry, lease=5000, grace=1)
    queue = Queue(Q, storage=live_storage)
    yield queue, worker, state
    worker.stop(hurry=True)
    if worker.started.is_set():
        assert worker.stopped.wait(30)


def enqueue_failing(queue: Queue, n: int) -> list[str]:
    ids = [f"job-{i}" for i in range(n)]
    options = {"max_attempts": 2, "min_backoff": 1, "max_backoff": 1}
    queue.enqueue_many(
        [{"id": job_id, "payload": {"n": i}, **options} for i, job_id in enumerate(ids)]
    )
    return ids


def test_jobs_that_fail_for_good_are_listed_with_payload_and_error(setup):
    queue, worker, _ = setup
    enqueue_failing(queue, 3)
    worker.start()
    assert wait_until(lambda: queue.count_dead() == 3), queue.counts()
    dead = queue.dead_letters()
    assert all(isinstance(d, DeadLetter) for d in dead)
    by_id = {d.job_id: d for d in dead}
    assert by_id["job-1"].payload == {"n": 1}
    assert by_id["job-1"].error["type"] == "builtins.ValueError"
    assert by_id["job-1"].error["message"] == "broken: 1"
    assert by_id["job-1"].status.state is JobState.FAILED
    assert by_id["job-1"].status.attempts == 2


def test_retry_one_then_the_rest_in_bulk_runs_them_again(setup):
    queue, worker, state = setup
    enqueue_failing(queue, 4)
    worker.start()
    assert wait_until(lambda: queue.count_dead() == 4)
    state["fixed"] = True
    assert queue.retry("job-0") is RetryOutcome.RETRIED
    assert wait_until(lambda: queue.get_status("job-0").state is JobState.COMPLETED)
    assert queue.get_result("job-0").value == 0
    assert queue.count_dead() == 3
    assert queue.retry_dead() == 3
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 4), queue.counts()
    assert queue.dead_letters() == []
    # Each retried job started again from attempt 1.
    assert sorted(a for job_id, a in state["ran"] if job_id == "job-3") == [1, 1, 2]


def test_retry_many_reports_each_outcome(setup):
    queue, _, _ = setup
    queue.enqueue("waits", {"n": 1})
    queue.enqueue("gone", {"n": 2})
    queue.cancel("gone")
    outcomes = queue.retry_many(["waits", "gone", "unknown"])
    assert outcomes == {
        "waits": RetryOutcome.WAITING,
        "gone": RetryOutcome.RETRIED,
        "unknown": RetryOutcome.NOT_FOUND,
    }


def test_purge_deletes_dead_letters_and_frees_their_ids(setup):
    queue, worker, state = setup
    ids = enqueue_failing(queue, 3)
    worker.start()
    assert wait_until(lambda: queue.count_dead() == 3)
    assert queue.purge_dead([ids[0]]) == 1
    assert queue.count_dead() == 2
    assert queue.get_status(ids[0]) is None
    assert queue.purge_dead() == 2
    assert queue.dead_letters() == []
    state["fixed"] = True
    assert queue.enqueue(ids[1], {"n": 5}).outcome.value == "queued"


def test_bad_arguments_are_refused_before_anything_changes(setup):
    queue, _, _ = setup
    queue.enqueue("keep", {"n": 1})
    queue.cancel("keep")
    with pytest.raises(InvalidJobId):
        queue.retry_many(["keep", "bad id!"])
    assert queue.get_status("keep").state is JobState.CANCELLED  # nothing was retried
    with pytest.raises(InvalidOption):
        queue.dead_letters(limit=0)
    with pytest.raises(InvalidOption):
        queue.dead_letters(offset=-1)
    with pytest.raises(InvalidJobId):
        queue.purge_dead(["../x"])


@pytest.mark.redis
def test_jobq_dead_command_lists_shows_retries_and_purges(settings, redis_prefix, capsys):
    from django.core.management import call_command

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix}
    queue = Queue(Q)
    for job_id in ("c1", "c2", "c3"):
        queue.enqueue(job_id, {"n": job_id}, max_attempts=1)
        claimed = queue.storage.claim(Q, "w", 1, 5000).jobs[0]
        queue.storage.fail(
            Q, claimed.job_id, claimed.token, b'{"type": "KeyError", "message": "k"}'
        )
    call_command("jobq_dead", "list", Q)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["c3", "c2", "c1"]
    assert json.loads(lines[0])["error"] == "KeyError: k"
    call_command("jobq_dead", "show", Q, "c2")
    shown = json.loads(capsys.readouterr().out)
    assert (shown["state"], shown["payload"]) == ("failed", {"n": "c2"})
    call_command("jobq_dead", "retry", Q, "c1", "nope")
    assert capsys.readouterr().out.splitlines() == [f"{Q}/c1: retried", f"{Q}/nope: not_found"]
    call_command("jobq_dead", "purge", Q, "--all", "--yes")
    assert "deleted 2 dead letter(s)" in capsys.readouterr().out
    assert queue.count_dead() == 0 and queue.get_status("c1").state is JobState.QUEUED
    with pytest.raises(CommandError):
        call_command("jobq_dead", "retry", Q)  # neither ids nor --all


def test_jobs_failed_back_to_back_list_newest_first(setup):
    """Many failures within one millisecond: the list still reads in the reverse of their
    order (a score of whole milliseconds tied them, and the tie broke by id)."""
    queue, _, _ = setup
    ids = [f"b{i:02d}" for i in range(40)]
    # Ids whose alphabetical order is the reverse of their failure order would hide a tie.
    ids.reverse()
    for job_id in ids:
        queue.enqueue(job_id, {"n": 0}, max_attempts=1)
        claimed = queue.storage.claim(Q, "w", 1, 5000).jobs[0]
        queue.storage.fail(Q, claimed.job_id, claimed.token, b'{"type": "E", "message": ""}')
    assert [d.job_id for d in queue.dead_letters(limit=100)] == ids[::-1]


def test_counts_count_jobs_not_finishes_and_include_cancelled(live_storage):
    """Issue 36: one job failed, retried by an operator and failed again three times read
    `failed: 4` on Redis (1 on the database); no backend counted cancelled jobs."""
    q = Queue("counted", storage=live_storage)
    q.enqueue("bad", {}, max_attempts=1)
    for round_ in range(4):
        (job,) = live_storage.claim("counted", "w", 1, 60_000).jobs
        live_storage.fail("counted", job.job_id, job.token, b'{"message": "no"}', permanent=True)
        if round_ < 3:
            assert q.retry("bad") is RetryOutcome.RETRIED
    q.enqueue("good", {})
    (job,) = live_storage.claim("counted", "w", 1, 60_000).jobs
    live_storage.complete("counted", job.job_id, job.token, b"1")
    q.enqueue("dropped", {})
    assert q.cancel("dropped") == "cancelled"
    counts = q.counts()
    finals = {s: counts[s] for s in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)}
    assert finals == {JobState.COMPLETED: 1, JobState.FAILED: 1, JobState.CANCELLED: 1}
    assert q.retry("dropped") is RetryOutcome.RETRIED  # a cancelled job run again
    assert q.counts()[JobState.CANCELLED] == 0 and q.counts()[JobState.QUEUED] == 1
