"""Progress and log lines of a running attempt (``Storage.report``), on every backend."""

from __future__ import annotations

import json

from django_jobq.job import LOG_LINES

from .test_scheduling_contract import claim_one, job

Q = "progress-q"


def test_progress_replaces_the_last_one_and_is_kept_with_the_record(storage):
    storage.enqueue(Q, job("p"))
    claimed = claim_one(storage, Q)
    assert storage.report(Q, "p", claimed.token, progress=b"10") is True
    assert storage.report(Q, "p", claimed.token, progress=b'{"done": 5, "of": 9}') is True
    assert json.loads(storage.get_record(Q, "p").progress) == {"done": 5, "of": 9}
    storage.complete(Q, "p", claimed.token, b"1")
    assert json.loads(storage.get_record(Q, "p").progress) == {"done": 5, "of": 9}


def test_log_lines_are_appended_with_their_time_oldest_first(storage, clock):
    storage.enqueue(Q, job("l"))
    claimed = claim_one(storage, Q)
    start = clock.now
    storage.report(Q, "l", claimed.token, log="fetched")
    clock.advance(50)
    storage.report(Q, "l", claimed.token, log="parsed ünïcode ✓", progress=b"50")
    logs = storage.get_record(Q, "l").logs
    assert [line for _, line in logs] == ["fetched", "parsed ünïcode ✓"]
    assert abs(logs[0][0] - start) <= 1 and abs(logs[1][0] - (start + 50)) <= 1
    assert json.loads(storage.get_record(Q, "l").progress) == 50


def test_only_the_last_log_lines_are_kept(storage):
    storage.enqueue(Q, job("many"))
    claimed = claim_one(storage, Q)
    for i in range(LOG_LINES + 5):
        storage.report(Q, "many", claimed.token, log=f"line {i}")
    lines = [line for _, line in storage.get_record(Q, "many").logs]
    assert len(lines) == LOG_LINES
    assert (lines[0], lines[-1]) == ("line 5", f"line {LOG_LINES + 4}")


def test_a_stale_attempt_cannot_report(storage, clock):
    storage.enqueue(Q, job("s", max_stalls=3))
    old = claim_one(storage, Q)
    clock.advance(60_000)
    storage.reap(Q)  # the lease expired: the job is queued again
    new = claim_one(storage, Q)
    assert storage.report(Q, "s", old.token, progress=b"99", log="late") is False
    assert storage.get_record(Q, "s").progress is None
    assert storage.report(Q, "s", new.token, progress=b"1") is True
    storage.complete(Q, "s", new.token, b"1")
    assert storage.report(Q, "s", new.token, log="after the end") is False
    assert storage.get_record(Q, "s").logs == ()


def test_reports_are_events(storage):
    storage.enqueue(Q, job("e"))
    claimed = claim_one(storage, Q)
    storage.report(Q, "e", claimed.token, progress=b"3")
    storage.report(Q, "e", claimed.token, log="x")
    kinds = [e.kind for e in storage.read_events(Q) if e.job_id == "e"]
    assert kinds[-2:] == ["progress", "log"]


def test_an_operator_retry_clears_progress_but_keeps_the_logs(storage):
    storage.enqueue(Q, job("r", max_attempts=1))
    claimed = claim_one(storage, Q)
    storage.report(Q, "r", claimed.token, progress=b"80", log="before the crash")
    storage.fail(Q, "r", claimed.token, b'{"type": "E", "message": "m"}')
    storage.retry(Q, "r")
    record = storage.get_record(Q, "r")
    assert record.progress is None
    assert [line for _, line in record.logs] == ["before the crash"]
