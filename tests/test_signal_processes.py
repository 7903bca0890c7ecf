"""Job signals sent inside a real ``runworker`` process (Redis backend): the worker's receiver
writes a ledger this test reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from django_jobq import JobFailed
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_worker_signals_are_sent_in_the_worker_process(redis_client, redis_prefix, tmp_path):
    ledger = tmp_path / "signals.jsonl"
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_SIGNAL_LOG": str(ledger)})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    echo, fail = Queue("tests-echo", storage=storage), Queue("tests-fail", storage=storage)
    try:
        worker = spawn("runworker", "tests-echo", "tests-fail", "--worker-id", "sig-proc",
                       log="worker")  # fmt: skip
        assert echo.enqueue_and_wait("e1", {"n": 1}, timeout=30)["echo"] == {"n": 1}
        with pytest.raises(JobFailed):
            fail.enqueue_and_wait("f1", {}, max_attempts=2, min_backoff=10, max_backoff=10,
                                  timeout=30)  # fmt: skip
        assert wait_until(
            lambda: any(e["signal"] == "job_failed" for e in read_ledger(ledger)), 20
        ), Path(worker.log_path).read_text()
    finally:
        spawn.stop_all()
    events = read_ledger(ledger)
    assert {e["pid"] for e in events} == {worker.pid}  # all sent in the worker, none here
    by_job = {(e["job_id"], e["signal"], e.get("attempt")): e for e in events}
    assert by_job["e1", "job_started", 1]["worker_id"] == "sig-proc"
    assert by_job["e1", "job_finished", 1]["outcome"] == "completed"
    assert by_job["f1", "job_retrying", 1]["error"]["message"] == "boom on attempt 1"
    assert by_job["f1", "job_failed", 2]["error"]["message"] == "boom on attempt 2"
    assert [e["outcome"] for e in events if e["signal"] == "job_finished"
            and e["job_id"] == "f1"] == ["retrying", "failed"]  # fmt: skip
    assert not any(e["signal"] == "job_enqueued" for e in events)  # enqueued here, not there
    assert os.getpid() != worker.pid
