"""``runworker --metrics-port``: a real worker process serves its own metrics over HTTP."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from django_jobq import JobFailed, JobState
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until
from .test_metrics import samples, value

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ECHO = "tests.jobsapp.jobs.echo"
FAIL = "tests.jobsapp.jobs.fail"


def endpoint(log: Path) -> str | None:
    found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
    return found.group(1) if found else None


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback
        return samples(response.read())


def test_worker_endpoint_counts_what_the_worker_ran(redis_client, redis_prefix, tmp_path):
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    echo, fail = Queue("tests-echo", storage=storage), Queue("tests-fail", storage=storage)
    try:
        worker = spawn("runworker", "tests-echo", "tests-fail", "-c", "4", "--worker-id",
                       "metrics-proc", "--metrics-port", "0", log="worker")  # fmt: skip
        log = Path(worker.log_path)
        assert wait_until(lambda: endpoint(log) is not None, 30), log.read_text()
        url = endpoint(log)
        for i in range(5):
            assert echo.enqueue_and_wait(f"e{i}", i, timeout=30)["echo"] == i
        for i in range(2):
            with pytest.raises(JobFailed):
                fail.enqueue_and_wait(f"f{i}", {}, max_attempts=2, min_backoff=10,
                                      max_backoff=10, timeout=30)  # fmt: skip
        assert wait_until(
            lambda: value(scrape(url), "jobq_jobs_failed_total", queue="tests-fail",
                          handler=FAIL) == 2, 20,
        )  # fmt: skip
        found = scrape(url)
    finally:
        spawn.stop_all()
    assert value(found, "jobq_jobs_started_total", queue="tests-echo", handler=ECHO) == 5
    assert value(found, "jobq_jobs_completed_total", queue="tests-echo", handler=ECHO) == 5
    assert value(found, "jobq_jobs_started_total", queue="tests-fail", handler=FAIL) == 4
    assert value(found, "jobq_jobs_retried_total", queue="tests-fail", handler=FAIL) == 2
    assert value(found, "jobq_job_run_seconds_count", queue="tests-echo", handler=ECHO,
                 outcome="completed") == 5  # fmt: skip
    assert value(found, "jobq_worker_slots", worker="metrics-proc") == 4
    assert value(found, "jobq_worker_slots_busy", worker="metrics-proc") == 0
    assert 0 <= value(found, "jobq_worker_heartbeat_age_seconds", worker="metrics-proc") < 60
    # Enqueues happened in this process, not the worker's: the worker does not count them.
    assert not any(name == "jobq_jobs_enqueued_total" for name, _ in found)


def test_a_taken_metrics_port_stops_the_worker_with_a_clear_error(tmp_path, redis_prefix):
    import socket

    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")})  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn("runworker", "tests-echo", "--metrics-port", str(port), log="taken")
        try:
            assert proc.wait(30) != 0
        finally:
            spawn.stop_all()
    assert "metrics endpoint" in Path(proc.log_path).read_text()


def test_worker_endpoint_histograms_how_long_jobs_waited(redis_client, redis_prefix, tmp_path):
    """Four jobs wait in a paused queue at least ``HELD`` seconds (a lower bound the test makes
    happen, not a speed); two more are enqueued once the worker is idle. The worker's wait
    histogram counts all six, the held four above ``HELD``."""
    held = 2.5
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    echo = Queue("tests-echo", storage=storage)
    echo.pause()
    echo.enqueue_many([(f"held{i}", i) for i in range(4)])
    # Taken once the enqueue returned, so every held job's enqueue stamp is no later; the
    # margin keeps a wait of exactly ``held`` (in the 2.5 bucket: ``le`` is inclusive) out.
    enqueued = time.time() + 0.1
    try:
        worker = spawn("runworker", "tests-echo", "-c", "4", "--metrics-port", "0", log="worker")
        log = Path(worker.log_path)
        assert wait_until(lambda: endpoint(log) is not None, 30), log.read_text()
        url = endpoint(log)
        assert wait_until(lambda: time.time() - enqueued > held, 30)
        echo.resume()
        assert wait_until(lambda: echo.counts()[JobState.COMPLETED] == 4, 30)
        for i in range(2):
            assert echo.enqueue_and_wait(f"idle{i}", i, timeout=30)["echo"] == i
        found = scrape(url)
    finally:
        spawn.stop_all()
    labels = {"queue": "tests-echo", "handler": ECHO}
    assert value(found, "jobq_job_wait_seconds_count", **labels) == 6
    assert value(found, "jobq_job_wait_seconds_bucket", le="+Inf", **labels) == 6
    # The held four waited longer than `held`: no more than the two others under it.
    assert value(found, "jobq_job_wait_seconds_bucket", le="2.5", **labels) <= 2
    assert value(found, "jobq_job_wait_seconds_sum", **labels) >= 4 * held
    assert not any(dict(labels_).get("job_id") for _, labels_ in found)
