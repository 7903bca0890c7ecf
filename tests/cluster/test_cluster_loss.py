"""A failover to a replica that is behind: the accepted jobs it loses without the journal, and
the journal (replayed by the reaper) giving every one of them back.

On loopback a replica never lags by itself, and SIGSTOP alone does not make it lag (the kernel
keeps the stream for it). So the lag is made exact: the replica of the queue's master is
paused, the master closes its replication link (``CLIENT KILL TYPE replica``), jobs are
accepted (the producer got ``queued``), a stale worker leases them all, the master is
SIGKILLed, and the replica is resumed and promoted (``CLUSTER FAILOVER TAKEOVER``). Everything
the master acknowledged after the cut existed on it alone.

Asserted, decided on the records (no timing):
- without the journal, exactly the jobs accepted after the cut are gone, and only those;
- with ``durability="journal"``, the reaper's journal replay re-creates every one of them, the
  same id and payload, and the journal empties once they ran;
- in both, the stale worker (its leases handed out by the dead master) is told by its
  heartbeat that every lease is lost, and its verdicts (complete, fail, release, through
  ``ack_many`` as a worker sends them) are refused (``lease_lost``) before and after the jobs
  are claimed again on the promoted master; the new claims carry larger tokens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from django.db import connections

from django_jobq.job import AckOutcome, ClaimedJob, EnqueueOutcome
from django_jobq.queue import Queue
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.worker.reaper import Reaper

from ..chaos.restart_support import write_report
from ..helpers import wait_until
from ..redis_cluster import ClusterUnsupported, LocalCluster, worker_block

QUEUE = "lossq"
BEFORE = 30  # accepted and replicated before the cut: must survive in both modes
WINDOW = 50  # accepted after the cut: on the dead master only
ACCEPTED = (EnqueueOutcome.QUEUED, EnqueueOutcome.PENDING)

pytestmark = [
    pytest.mark.redis_cluster,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["pg"], transaction=True),
]


@pytest.fixture
def loss_cluster(tmp_path):
    try:
        cluster = LocalCluster(tmp_path / "cluster", worker_block(second=True))
    except ClusterUnsupported as exc:
        pytest.skip(f"no Redis Cluster tests: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture
def make_queue(loss_cluster, settings):
    clients = []

    def make(durability: str) -> Queue:
        settings.JOBQ = {
            **settings.JOBQ,
            "BACKEND": "redis",
            "REDIS_URL": loss_cluster.url,
            "PREFIX": "jqloss",
            "QUEUES": {QUEUE: {"durability": durability}},
            "JOURNAL": {"DATABASE_ALIAS": "pg", "MIN_AGE": 0.0, "RECONCILE_INTERVAL": 0.2},
            "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": "pg"},
        }
        client = client_from_url(loss_cluster.url)
        clients.append(client)
        queue = Queue(QUEUE, storage=RedisStorage(client, prefix="jqloss"))
        assert queue.durability == durability
        return queue

    yield make
    for client in clients:
        client.close()


@dataclass
class Failover:
    before: list[str]  # accepted, replicated
    window: list[str]  # accepted after the replica's link was cut
    stale: list[ClaimedJob]  # leases the dead master handed out after the cut


def accept(queue: Queue, ids: list[str]) -> None:
    for n, job_id in enumerate(ids):
        result = queue.enqueue(job_id, {"id": job_id, "n": n})
        assert result.outcome in ACCEPTED, (job_id, result)


def answers(storage: RedisStorage) -> bool:
    """The client reaches the queue's (new) master: its topology caught up."""
    try:
        storage.job_states(QUEUE, ["probe"])
    except Exception:
        return False
    return True


def fail_over_to_a_replica_behind(cluster: LocalCluster, queue: Queue) -> Failover:
    storage = queue.storage
    tag = storage.keys(QUEUE).wake
    master = cluster.master_of(tag)
    replica = cluster.replica_of(master)
    run = Failover([f"b{i}" for i in range(BEFORE)], [f"w{i}" for i in range(WINDOW)], [])
    accept(queue, run.before)
    assert cluster.replicated(master), "the replica never caught up before the fault"
    cluster.pause(replica)
    try:
        assert cluster.cut_replication(master) == 1
        accept(queue, run.window)
        run.stale = storage.claim(QUEUE, "stale-worker", BEFORE + WINDOW, 600_000).jobs
        assert len(run.stale) == BEFORE + WINDOW
        cluster.kill(master)
    finally:
        cluster.resume(replica)
    cluster.takeover(replica)
    assert wait_until(lambda: cluster.master_of(tag) == replica, 60, 0.05), "not promoted"
    assert wait_until(lambda: answers(storage), 60, 0.1), "the client never found the new master"
    return run


def stale_verdicts(storage: RedisStorage, stale: list[ClaimedJob]) -> set[AckOutcome]:
    """The stale worker's heartbeat and verdicts, through the worker's own batch paths: a
    heartbeat must report every lease lost, and each verdict (complete, fail, release in
    turn) must be refused; returns the verdicts' outcomes."""
    leases = [(job.job_id, job.token) for job in stale]
    assert sorted(storage.heartbeat(QUEUE, "stale-worker", leases, 600_000)) == sorted(leases)
    kinds = ("complete", "fail", "release")
    body = {"complete": b"null", "fail": b'{"type": "Boom", "message": "late"}', "release": b""}
    acks = [
        Ack(kinds[n % 3], job.job_id, job.token, body[kinds[n % 3]]) for n, job in enumerate(stale)
    ]
    return set(storage.ack_many(QUEUE, acks))


def claim_and_complete_all(storage: RedisStorage, run: Failover, expected: int) -> None:
    """A live worker claims everything the promoted master holds: new tokens, and the stale
    worker's verdicts still refused; then the live worker's verdicts are accepted."""
    fresh = storage.claim(QUEUE, "live-worker", BEFORE + WINDOW, 600_000).jobs
    assert len(fresh) == expected
    old = {job.job_id: job.token for job in run.stale}
    assert all(job.token > old[job.job_id] for job in fresh)
    assert stale_verdicts(storage, run.stale) == {AckOutcome.LEASE_LOST}
    done = {storage.complete(QUEUE, j.job_id, j.token, b"null") for j in fresh}
    assert done == {AckOutcome.COMPLETED}


def test_without_the_journal_a_failover_loses_exactly_the_jobs_the_replica_missed(
    loss_cluster, make_queue
):
    queue = make_queue("redis")
    run = fail_over_to_a_replica_behind(loss_cluster, queue)

    states = dict(zip(run.before + run.window, queue.storage.job_states(
        QUEUE, run.before + run.window), strict=True))  # fmt: skip
    lost = sorted(job_id for job_id, state in states.items() if state is None)
    write_report(
        "cluster failover to a replica behind, durability redis",
        accepted=BEFORE + WINDOW, accepted_after_cut=WINDOW, lost=len(lost),
    )  # fmt: skip
    assert lost == sorted(run.window), f"lost {len(lost)} of {BEFORE + WINDOW} accepted"
    # The claim was lost too: the replicated jobs are waiting again, none is stuck active.
    assert {states[job_id] for job_id in run.before} == {JobState.QUEUED}
    assert stale_verdicts(queue.storage, run.stale) == {AckOutcome.LEASE_LOST}
    claim_and_complete_all(queue.storage, run, BEFORE)


def test_with_the_journal_the_reaper_recreates_every_job_the_failover_lost(
    loss_cluster, make_queue
):
    from django_jobq.models import JournalEntry

    queue = make_queue("journal")
    run = fail_over_to_a_replica_behind(loss_cluster, queue)
    # Redis really lost them (or the replay below would prove nothing).
    missing = [j for j, state in zip(run.window, queue.storage.job_states(
        QUEUE, run.window), strict=True) if state is None]  # fmt: skip
    assert missing == run.window
    # The stale verdicts come first, while the lost jobs are still missing: refused.
    assert stale_verdicts(queue.storage, run.stale) == {AckOutcome.LEASE_LOST}

    reaper = Reaper([QUEUE], storage=queue.storage, interval=0.1, mirror=False,
                    retention_days=None, schedules=False, reconcile=True)  # fmt: skip
    thread = threading.Thread(target=reap_until_stopped, args=(reaper,), daemon=True)
    thread.start()
    try:
        everyone = run.before + run.window
        assert wait_until(lambda: None not in queue.storage.job_states(QUEUE, everyone), 60), (
            "the reaper did not re-create the jobs the failover lost"
        )
        states = queue.storage.job_states(QUEUE, everyone)
        write_report(
            "cluster failover to a replica behind, durability journal",
            accepted=BEFORE + WINDOW, accepted_after_cut=WINDOW, lost_by_redis=len(missing),
            lost=sum(1 for state in states if state is None),
        )  # fmt: skip
        assert set(states) == {JobState.QUEUED}
        record = queue.storage.get_record(QUEUE, run.window[0])
        assert record is not None and b'"w0"' in record.payload
        claim_and_complete_all(queue.storage, run, BEFORE + WINDOW)
        # Once the reaper sees them finished, their entries go: nothing is replayed again.
        entries = JournalEntry.objects.using("pg").filter(queue=QUEUE)
        assert wait_until(lambda: not entries.exists(), 60), entries.count()
    finally:
        reaper.stop()
        thread.join(30)
    assert not thread.is_alive()


def reap_until_stopped(reaper: Reaper) -> None:
    try:
        reaper.run()
    finally:
        connections.close_all()
