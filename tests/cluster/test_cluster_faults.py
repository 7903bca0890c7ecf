"""Faults of a Redis Cluster under load: a master SIGKILLed (its replica is promoted), and the
queue's slot migrated to another master (MOVED/ASK).

The killed master's replica is stalled (SIGSTOP) for the second before the kill and resumed
after it. Measured: that does not make it lag, since the kernel holds the replication stream the
master sent meanwhile and the replica reads it on resuming. A replica that is really behind
(what the journal is for) is ``test_cluster_loss.py``: there the master also closes the
replication link, so the writes after it are on the master only.
Each test has a cluster of its own (six more ``redis-server`` processes, persistence off),
producers in threads of this process, two real ``runworker`` processes and a ``runreaper``
running the ledger handler of the fault suite (``tests/chaos/restart_support.py``) into a
PostgreSQL ledger database of this suite's own. Every job is due 2 s after its enqueue, so the
killed master always holds accepted jobs that have not run: what asynchronous replication had
not yet copied to the replica is gone with it.

Asserted: every producer call ended (an error or a success, none hung); both workers run jobs
again after the fault without being restarted; no run got a fencing token another run of the
same job had (so no verdict of a run before the fault can pass for a later one); with the
journal, 0 accepted jobs lost after ``jobq_reconcile``; after a migration, 0 lost without the
journal. Measured and reported (the fault suite's report file): the loss without the journal,
duplicates, the failover and recovery times.
"""

from __future__ import annotations

import io
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.management import call_command

from django_jobq.job import EnqueueOutcome
from django_jobq.queue import Queue
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage
from tests.chaos.restart_support import QUEUE, Ledger, Processes, write_report

from ..helpers import PROCESS_START, wait_until
from ..redis_cluster import ClusterUnsupported, LocalCluster, worker_block

# One ledger database per xdist process: two fault tests may run at once.
LEDGER_DB = "jobq_cluster_ledger_" + os.environ.get("PYTEST_XDIST_WORKER", "main")
ACCEPTED = (EnqueueOutcome.QUEUED, EnqueueOutcome.PENDING)
DELAY_MS = 2000
JOBS = 1500
SECONDS = 12.0  # the producers spread the jobs over this long; the fault comes 4 s in
LAG = 1.0  # seconds of writes the promoted replica never received

pytestmark = [
    pytest.mark.redis_cluster,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["pg"], transaction=True),
]


@dataclass
class Calls:
    lock: threading.Lock = field(default_factory=threading.Lock)
    made: int = 0
    accepted: int = 0
    errors: list[str] = field(default_factory=list)


def produce(q: Queue, ledger: Ledger, calls: Calls, ids: list[str], until: float) -> None:
    start = time.time()
    step = max(until - start, 0.001) / len(ids)
    try:
        for n, job_id in enumerate(ids):
            pause = start + n * step - time.time()
            if pause > 0:
                time.sleep(pause)  # pacing the load, not waiting for an outcome
            with calls.lock:
                calls.made += 1
            try:
                result = q.enqueue(job_id, {"n": n}, max_stalls=10, delay=DELAY_MS)
            except Exception as exc:
                with calls.lock:
                    calls.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if result.outcome in ACCEPTED:
                ledger.accepted([job_id])
                with calls.lock:
                    calls.accepted += 1
    finally:
        from django.db import connections

        connections.close_all()
        ledger.close()


def reused_tokens(ledger: Ledger) -> int:
    """Runs that got a (job, token) another run of the job had already got: after a failover
    to a replica that had not seen a claim, the token counter may hand one out again."""
    with ledger.connect() as conn:
        return int(
            conn.execute(
                "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM executions"
                " GROUP BY job_id, token HAVING count(*) > 1) t"
            ).fetchone()[0]
        )


def owner(cluster: LocalCluster, key: str) -> int | None:
    """The live master owning ``key``'s slot, None while no live master does."""
    try:
        return cluster.master_of(key)
    except RuntimeError:
        return None


@pytest.fixture
def fault_cluster(tmp_path):
    try:
        cluster = LocalCluster(tmp_path / "cluster", worker_block(second=True))
    except ClusterUnsupported as exc:
        pytest.skip(f"no Redis Cluster tests: {exc}")
    yield cluster
    cluster.stop()


class Rig:
    """Producers, two workers and a reaper on ``cluster``, in the given durability."""

    def __init__(
        self, cluster: LocalCluster, tmp_path: Path, settings, durability: str, shards: int = 1
    ) -> None:
        self.cluster = cluster
        self.ledger = Ledger(LEDGER_DB)
        self.procs = Processes(tmp_path, cluster.url)
        self.procs.env["JOBQ_CHAOS_LEDGER_DB"] = LEDGER_DB
        self.procs.env["JOBQ_CHAOS_SHARDS"] = str(shards)
        # The journal's database as this test sees it (pytest-django's, suffixed per xdist
        # process), so that the reaper reconciles the journal the producers wrote.
        self.procs.env["JOBQ_TEST_PG_DB"] = settings.DATABASES["pg"]["NAME"]
        settings.JOBQ = {
            **settings.JOBQ,
            "BACKEND": "redis",
            "REDIS_URL": cluster.url,
            "PREFIX": "jobq",
            "QUEUES": {
                QUEUE: {"durability": durability, **({"shards": shards} if shards > 1 else {})}
            },
            "JOURNAL": {"DATABASE_ALIAS": "pg", "MIN_AGE": 2.0},
            "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": "pg"},
        }
        self.client = client_from_url(cluster.url)
        self.queue = Queue(QUEUE, storage=RedisStorage(self.client, prefix="jobq"))
        assert self.queue.durability == durability
        # The queue's first physical queue (its first partition when sharded): the one whose
        # master the faults hit. A sharded queue's other partitions live on other masters.
        self.physical = getattr(self.queue, "partition_names", [QUEUE])[0]
        self.calls = Calls()

    def start(self, reconcile: bool) -> list[int]:
        for _ in range(2):
            self.procs.spawn("runworker", QUEUE, "-c", "8", "--lease", "3000", log="worker")
        reaper = ["runreaper", QUEUE, "--no-schedules", "--interval", "0.5"]
        self.procs.spawn(*reaper, *(["--reconcile"] if reconcile else []), log="reaper")
        assert wait_until(lambda: len(self.queue.storage.list_workers()) == 2, PROCESS_START)
        return [p.pid for p in self.procs.procs[:2]]

    def produce(self, jobs: int, seconds: float) -> tuple[list[threading.Thread], float]:
        started = time.time()
        threads = [
            threading.Thread(
                target=produce,
                args=(
                    self.queue,
                    self.ledger,
                    self.calls,
                    [f"c{t}-{i}" for i in range(t, jobs, 3)],
                    started + seconds,
                ),
            )  # fmt: skip
            for t in range(3)
        ]
        for thread in threads:
            thread.start()
        return threads, started

    def settled(self) -> bool:
        counts = self.queue.counts()  # a sharded queue's: summed over its partitions
        return sum(counts[s] for s in counts if s.value in ("queued", "scheduled", "active")) == 0

    def stop(self) -> None:
        self.procs.stop_all()
        self.client.close()


@pytest.mark.parametrize("shards", [1, 3], ids=["one-queue", "sharded-3"])
@pytest.mark.parametrize("durability", ["journal", "redis"])
def test_a_master_killed_under_load_loses_no_accepted_job_with_the_journal(
    request, fault_cluster, tmp_path, settings, durability, shards
):
    """Sharded (issue 36): the master of one of the three partitions is killed mid-drain;
    the other partitions, on the other masters, go on being served meanwhile."""
    rig = Rig(fault_cluster, tmp_path, settings, durability, shards)
    try:
        pids = rig.start(reconcile=durability == "journal")
        tag = rig.queue.storage.keys(rig.physical).wake
        victim = fault_cluster.master_of(tag)
        threads, started = rig.produce(JOBS, SECONDS)
        time.sleep(max(0.0, started + 4.0 - time.time()))  # the fault comes 4 s into the load
        # The replica is stalled when its master dies, and comes back to be promoted.
        replica = fault_cluster.replica_of(victim)
        fault_cluster.pause(replica)
        time.sleep(LAG)  # the length of the lag, not a wait for an outcome
        fault_cluster.kill(victim)
        killed_at = time.time()
        fault_cluster.resume(replica)
        # A replica takes the slot over (cluster-node-timeout, then an election).
        assert wait_until(lambda: owner(fault_cluster, tag) not in (None, victim), 60, 0.2), (
            "no replica was promoted"
        )
        promoted_at = time.time()
        for thread in threads:
            thread.join(SECONDS + 120)
            assert not thread.is_alive(), "a producer call never returned"
        # Both workers run jobs again, without a restart (same PIDs).
        for pid in pids:
            assert wait_until(lambda p=pid: rig.ledger.first_start_after(promoted_at, p), 60)
        assert [p.poll() for p in rig.procs.procs] == [None, None, None]

        out = io.StringIO()
        if durability == "journal":
            # A sharded queue's name reconciles its partitions' entries.
            call_command("jobq_reconcile", QUEUE, "--min-age", "0", stdout=out)
            assert wait_until(lambda: rig.ledger.figures()["lost"] == 0, 180, 0.5), (
                rig.ledger.lost_ids()
            )
        else:
            assert wait_until(rig.settled, 120, 0.5)
        figures = rig.ledger.figures()
        recovery = max(rig.ledger.first_start_after(promoted_at, p) - killed_at for p in pids)
        write_report(
            request.node.nodeid,
            fault=f"cluster master SIGKILLed, replica {LAG:.0f} s behind promoted ({durability}"
            f"{', one of 3 partitions' if shards > 1 else ''})",
            load=f"{JOBS} jobs over {SECONDS:.0f} s, 3 producers, 2 workers x 8",
            accepted=rig.calls.accepted, errors=len(rig.calls.errors),
            lost=figures["lost"], duplicated=figures["duplicated"],
            reused_tokens=reused_tokens(rig.ledger),
            failover_s=round(promoted_at - killed_at, 2), recovery_s=round(recovery, 2),
            reconcile=out.getvalue().strip(),
        )  # fmt: skip
        assert rig.calls.made == JOBS
        assert rig.calls.made == rig.calls.accepted + len(rig.calls.errors)
        assert figures["enqueued"] == rig.calls.accepted
        if durability == "journal":
            assert figures["lost"] == 0, rig.ledger.lost_ids()
        # Tokens are clock-based (not a per-record counter), so a promoted replica that missed
        # a claim still hands out a new token: no verdict of a run before the failover can
        # pass for one of a run after it.
        assert reused_tokens(rig.ledger) == 0
    finally:
        rig.stop()


@pytest.mark.parametrize("shards", [1, 3], ids=["one-queue", "sharded-3"])
def test_the_queue_slot_migrated_to_another_master_under_load_loses_nothing(
    request, fault_cluster, tmp_path, settings, shards
):
    """No journal: a migration must lose nothing by itself. MOVED and ASK are followed by the
    clients; TRYAGAIN (a script whose keys are split between the two nodes) is retried, then
    refused as StorageUnavailable: such an enqueue was not accepted, so it is not a loss.
    Sharded: one partition's slot moves onto the master of another partition."""
    rig = Rig(fault_cluster, tmp_path, settings, "redis", shards)
    try:
        pids = rig.start(reconcile=False)
        tag = rig.queue.storage.keys(rig.physical).wake
        source = fault_cluster.master_of(tag)
        target = next(p for p in fault_cluster.masters() if p != source)
        threads, started = rig.produce(JOBS, SECONDS)
        time.sleep(max(0.0, started + 4.0 - time.time()))  # the move starts 4 s into the load
        began = time.time()
        moved = fault_cluster.migrate_slot(tag, target, batch=10)
        ended = time.time()
        assert fault_cluster.master_of(tag) == target
        for thread in threads:
            thread.join(SECONDS + 120)
            assert not thread.is_alive(), "a producer call never returned"
        for pid in pids:
            assert wait_until(lambda p=pid: rig.ledger.first_start_after(ended, p), 60)
        assert wait_until(rig.settled, 120, 0.5)
        assert wait_until(lambda: rig.ledger.figures()["lost"] == 0, 60, 0.5), rig.ledger.lost_ids()
        figures = rig.ledger.figures()
        write_report(
            request.node.nodeid,
            fault="the queue's slot migrated to another master (MIGRATE in batches of 10 keys"
            f"{', one of 3 partitions' if shards > 1 else ''})",
            load=f"{JOBS} jobs over {SECONDS:.0f} s, 3 producers, 2 workers x 8",
            keys_moved=moved, migration_s=round(ended - began, 2),
            accepted=rig.calls.accepted, errors=len(rig.calls.errors),
            error_kinds=sorted({e.split(":")[0] for e in rig.calls.errors}),
            lost=figures["lost"], duplicated=figures["duplicated"],
            reused_tokens=reused_tokens(rig.ledger),
        )  # fmt: skip
        assert [p.poll() for p in rig.procs.procs] == [None, None, None]
        assert rig.calls.made == JOBS
        # A script whose keys are split between the two nodes cannot run until the move ends:
        # such a call is refused with a clear error (nothing half-done), never left hanging.
        assert all(e.startswith("StorageUnavailable") for e in rig.calls.errors), rig.calls.errors
        assert rig.calls.accepted + len(rig.calls.errors) == JOBS
        assert figures["enqueued"] == rig.calls.accepted
        assert figures["lost"] == 0
        assert reused_tokens(rig.ledger) == 0
    finally:
        rig.stop()
