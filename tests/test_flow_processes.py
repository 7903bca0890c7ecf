"""Flow control across several worker *processes*: the guarantees only hold if the backend
enforces them atomically, so these run real ``runworker`` processes against Redis and
PostgreSQL and check a ledger the handlers write (``tests-ledger`` in tests/jobsapp/jobs.py)
and the storage's own event times."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
from django.db import connections

from django_jobq import EnqueueOutcome, JobState
from django_jobq.queue import Queue

from .helpers import PROCESS_START, Spawner, wait_until

pytestmark = pytest.mark.slow
Q = "tests-ledger"
WORKER = ("runworker", Q, "-c", "4", "--lease", "5000", "--reap-interval", "0")


@pytest.fixture(params=["redis", "postgres"])
def backend(request):
    request.applymarker(getattr(pytest.mark, request.param))
    return request.param


@pytest.fixture
def spawn(backend, request, tmp_path):
    if backend == "redis":
        env = {"JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix")}
    else:
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": "pg",
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        }
    env["JOBQ_TEST_SQLITE"] = str(tmp_path / "subprocess.sqlite3")
    spawner = Spawner(tmp_path, env)
    yield spawner
    spawner.stop_all()


@pytest.fixture
def queue(backend, request) -> Queue:
    from .conftest import make_storage

    return Queue(Q, storage=make_storage(backend, request))


def start_workers(spawn, queue: Queue, n: int = 3) -> None:
    for i in range(n):
        spawn(*WORKER, log=f"worker{i}")
    assert wait_until(lambda: len(queue.storage.list_workers()) == n, PROCESS_START), (
        "workers never started"
    )


def read_ledger(path: Path) -> dict[str, list[tuple[float, float, int, int]]]:
    """id -> [(start, end, pid, attempt)] for every run that finished."""
    starts: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    runs: dict[str, list[tuple[float, float, int, int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        kind, job_id, pid, at, attempt = line.split()
        if kind == "start":
            starts[(job_id, pid)].append((float(at), int(attempt)))
        else:
            begun, att = starts[(job_id, pid)].pop(0)
            runs[job_id].append((begun, float(at), int(pid), att))
    return runs


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    current = peak = 0
    for _, step in points:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def claim_times(queue: Queue) -> list[tuple[int, str]]:
    """(storage ms, job id) of every claim, from the queue's event stream."""
    events = queue.storage.read_events(Q, "0", count=100_000)
    return sorted((e.at, e.job_id) for e in events if e.kind == "active")


def assert_sliding_window(times: list[int], limit: int, window: int) -> None:
    """No window of ``window`` ms holds more than ``limit`` claims: for every claim at t, the
    claims in (t - window, t] are at most ``limit``."""
    for i, t in enumerate(times):
        inside = sum(1 for u in times[: i + 1] if u > t - window)
        assert inside <= limit, f"{inside} claims within {window} ms ending at {t}: {times}"


def finished_runs_by_pid(ledger: Path, job_id: str) -> set[int]:
    """Pids of the processes whose run of ``job_id`` finished so far (read while the workers
    append: a line still being written is skipped)."""
    if not ledger.exists():
        return set()
    pids = set()
    for line in ledger.read_text().splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[:2] == ["end", job_id]:
            pids.add(int(fields[2]))
    return pids


def test_singleton_never_runs_two_instances_at_once(spawn, queue, tmp_path):
    """Successors of the singleton are enqueued (with other work in between, so every worker
    is busy with more than the singleton) until at least two worker processes have run it:
    the exclusion is only shown when several workers could have run it at once."""
    ledger = tmp_path / "ledger.txt"
    start_workers(spawn, queue)
    created = n = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if created >= 3 and len(finished_runs_by_pid(ledger, "the-one")) >= 2:
            break
        n += 1
        result = queue.enqueue(
            "the-one", {"ledger": str(ledger), "seconds": 0.05, "n": n},
            singleton=True, update_data=True, result_ttl=1,
        )  # fmt: skip
        created += result.outcome is EnqueueOutcome.QUEUED
        queue.enqueue(None, {"ledger": str(ledger), "seconds": 0.01})
        time.sleep(0.01)  # pacing of the producer only; nothing is decided on it
    assert created >= 3, "no blocked successor was ever created"
    assert len(finished_runs_by_pid(ledger, "the-one")) >= 2, "one worker ran every instance"
    assert wait_until(lambda: _idle(queue), 60), queue.counts()

    runs = read_ledger(ledger)["the-one"]
    assert max_overlap([(s, e) for s, e, _, _ in runs]) == 1
    assert len(runs) == created  # every instance stored ran exactly once


def test_concurrency_cap_holds_across_processes(spawn, queue, tmp_path):
    ledger = tmp_path / "ledger.txt"
    queue.set_limits(concurrency=2)
    start_workers(spawn, queue)
    queue.enqueue_many([(f"c{i}", {"ledger": str(ledger), "seconds": 0.1}) for i in range(24)])
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 24, 60), queue.counts()
    runs = read_ledger(ledger)
    intervals = [(s, e) for rs in runs.values() for s, e, _, _ in rs]
    assert len(intervals) == 24
    assert max_overlap(intervals) == 2  # the cap is reached, never passed


def test_rate_limits_hold_across_processes(spawn, queue, tmp_path):
    ledger = tmp_path / "ledger.txt"
    queue.set_limits(rate_max=6, rate_window=500, group_rate_max=2, group_rate_window=500)
    start_workers(spawn, queue)
    started = time.monotonic()
    jobs = [
        {"id": f"r{i}", "payload": {"ledger": str(ledger)}, "group": f"customer{i % 4}"}
        for i in range(36)
    ]
    queue.enqueue_many(jobs)
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 36, 90), queue.counts()
    elapsed = time.monotonic() - started

    claims = claim_times(queue)
    assert len(claims) == 36
    assert_sliding_window([t for t, _ in claims], 6, 500)
    group_of = {j["id"]: j["group"] for j in jobs}
    for group in {j["group"] for j in jobs}:
        assert_sliding_window([t for t, i in claims if group_of[i] == group], 2, 500)
    assert elapsed >= 2.5  # 36 jobs at 6 per 500 ms need at least five full windows


def test_handler_rate_limited_signal_uses_no_attempt(spawn, queue, tmp_path):
    ledger = tmp_path / "ledger.txt"
    start_workers(spawn, queue, n=2)
    ids = [f"l{i}" for i in range(10)]
    queue.enqueue_many(
        [{"id": i, "payload": {"ledger": str(ledger), "limited_once": True}, "max_attempts": 1}
         for i in ids]
    )  # fmt: skip
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 10, 60), queue.counts()
    runs = read_ledger(ledger)
    assert sorted(runs) == ids
    assert {att for rs in runs.values() for _, _, _, att in rs} == {1}  # postponed: no attempt
    for i in ids:  # each was limited once: the marker file exists
        assert (tmp_path / f"limited-{i}").exists()


def _idle(queue: Queue) -> bool:
    counts = queue.counts()
    waiting = (JobState.QUEUED, JobState.ACTIVE, JobState.SCHEDULED, JobState.BLOCKED)
    return all(counts.get(s, 0) == 0 for s in waiting)
