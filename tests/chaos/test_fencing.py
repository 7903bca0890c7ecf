"""Leases on the server's clock and fencing tokens: storage-level checks, and fault 3 (a
worker SIGSTOPped for 3 × its lease comes back to a job another worker finished)."""

from __future__ import annotations

import signal
import time

from django_jobq import JobState
from django_jobq.job import AckOutcome

from ..helpers import wait_until
from .conftest import events_of, sized


def server_ms(queue) -> int:
    seconds, micros = queue.storage.client.time()
    return seconds * 1000 + micros // 1000


def test_lease_deadline_is_set_by_the_server_clock_not_the_caller(queue_of, monkeypatch):
    queue = queue_of("chaos-fence")
    queue.enqueue("clocked", {})
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # the caller's clock is far off
    before = server_ms(queue)
    batch = queue.storage.claim("chaos-fence", "w1", 1, 5000)
    after = server_ms(queue)
    deadline = queue.storage.client.zscore(queue.storage.keys("chaos-fence").active, "clocked")
    assert batch.jobs and before + 5000 <= deadline <= after + 5000


def test_stale_tokens_are_refused_for_every_write(queue_of):
    queue = queue_of("chaos-fence")
    storage = queue.storage
    queue.enqueue("fenced", {}, max_stalls=3)
    (first,) = storage.claim("chaos-fence", "w1", 1, 200).jobs
    assert wait_until(lambda: storage.reap("chaos-fence").requeued == ["fenced"], 30)
    (second,) = storage.claim("chaos-fence", "w2", 1, 30_000).jobs
    assert first.token < second.token  # tokens of one id only grow
    stale = first.token
    assert storage.complete("chaos-fence", "fenced", stale, b"1") is AckOutcome.LEASE_LOST
    assert storage.fail("chaos-fence", "fenced", stale, b"{}") is AckOutcome.LEASE_LOST
    assert storage.release("chaos-fence", "fenced", stale) is AckOutcome.LEASE_LOST
    assert storage.heartbeat("chaos-fence", "w1", [("fenced", stale)], 30_000) == [
        ("fenced", stale)
    ]
    assert storage.report("chaos-fence", "fenced", stale, progress=b"1", log=None) is False
    assert storage.get_record("chaos-fence", "fenced").worker == "w2"
    assert storage.complete("chaos-fence", "fenced", second.token, b"2") is AckOutcome.COMPLETED
    assert storage.complete("chaos-fence", "fenced", second.token, b"3") is AckOutcome.LEASE_LOST
    assert [e.kind for e in events_of(queue) if e.kind == "completed"] == ["completed"]
    assert queue.get_result("fenced").value == 2


def test_sigstopped_worker_is_fenced_off_after_its_job_was_reclaimed(
    scale, supervise, ledger, queue_of, report
):
    lease_ms = 1500
    n = sized(scale, 2, 8)
    queue = queue_of("chaos-ledger")
    ids = [f"stopped-{i}" for i in range(n)]
    frozen = supervise(
        ["runworker", "chaos-ledger", "-c", str(n), "--lease", str(lease_ms),
         "--reap-interval", "0"], 1,
    )  # fmt: skip
    for job_id in ids:
        queue.enqueue(job_id, {"seconds": 1.5}, max_stalls=3)
    ledger.record_enqueued(ids)
    assert wait_until(lambda: len(ledger.runs_per_job()) == n, 30), "the first worker ran nothing"
    frozen.kill(0, signal.SIGSTOP)
    stopped_at = time.time()
    supervise(["runworker", "chaos-ledger", "-c", str(n), "--lease", str(lease_ms)], 1)
    supervise(["runreaper", "--interval", "0.2"], 1)
    # Frozen until the others have reclaimed and finished every job (however long a loaded
    # machine takes: at least one lease); only then does it wake up with its stale tokens.
    assert wait_until(
        lambda: all(queue.get_status(i).state is JobState.COMPLETED for i in ids), 60
    ), {i: queue.get_status(i).state for i in ids}
    states = {i: queue.get_status(i).state for i in ids}
    frozen.kill(0, signal.SIGCONT)
    resumed_at = time.time()
    # The resumed worker's handlers finish their runs and send stale completes.
    finished = "SELECT count(*) FROM executions WHERE finished IS NOT NULL"
    assert wait_until(lambda: ledger.query(finished)[0][0] == 2 * n, 60)
    assert wait_until(lambda: frozen.logs().count("verdict complete refused") == n, 60)
    report(
        fault="3. SIGSTOP a worker for 3 × lease, then SIGCONT",
        load=f"{n} jobs of 1.5 s, lease {lease_ms} ms",
        lost=sum(s is not JobState.COMPLETED for s in states.values()), duplicated=n,
        recovery=f"all reclaimed and completed {resumed_at - stopped_at:.1f} s after the stop"
        f" (lease {lease_ms / 1000:g} s), then SIGCONT;"
        f" {n} late completes refused",
    )  # fmt: skip
    assert set(states.values()) == {JobState.COMPLETED}  # finished by the other worker
    completions = [e.job_id for e in events_of(queue, "completed")]
    assert sorted(completions) == sorted(ids)  # exactly one completion per job
    for job_id in ids:
        status = queue.get_status(job_id)
        assert (status.state, status.stalls) == (JobState.COMPLETED, 1)
        runs = ledger.executions_of(job_id)
        # Claim tokens: the frozen run, then the reclaim, with a larger token.
        assert len(runs) == 2 and runs[0][1] < runs[1][1]
        assert runs[0][2] == frozen.pids()[0]
