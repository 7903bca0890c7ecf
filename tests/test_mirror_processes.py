"""The mirror under load, as deployed: ``runworker`` and ``runreaper`` processes, a bulk
enqueue far larger than the stream cap, and the rows checked against Redis job by job.

CI size: ``JOBQ_MIRROR_JOBS`` jobs (default 20,000) with a cap of 2,000 events, so the stream
is trimmed about 30 times over while the mirror runs. ``JOBQ_MIRROR_FULL=1`` runs 250,000
jobs (docs/benchmarks.md has that run's figures). The waits are bounded generously: they
fail a mirror that never converges, never a slow machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from django.db import connections

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import GROUP, Mirror
from django_jobq.mirror_check import lag
from django_jobq.models import Job
from django_jobq.states import JobState
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Q = "tests-echo"  # a queue with a handler in tests/jobsapp (the worker runs it)
FULL = os.environ.get("JOBQ_MIRROR_FULL") == "1"
JOBS = 250_000 if FULL else int(os.environ.get("JOBQ_MIRROR_JOBS", "20000"))
MAXLEN = 2_000
COMPLETED = JobState.COMPLETED
CONVERGE_S = 600 if FULL else 240  # a bound for a broken mirror, not a speed target


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    return request.param


def spawner_for(tmp_path, alias: str, prefix: str, redis_url: str) -> Spawner:
    return Spawner(tmp_path, {
        "JOBQ_TEST_PREFIX": prefix, "JOBQ_TEST_MIRROR": "1", "JOBQ_TEST_MIRROR_ALIAS": alias,
        "JOBQ_TEST_EVENTS_MAXLEN": str(MAXLEN), "JOBQ_TEST_REDIS_URL": redis_url,
        "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
    })  # fmt: skip


def assert_rows_equal_redis(storage: RedisStorage, alias: str, ids: list[str]) -> None:
    rows = dict(Job.objects.using(alias).filter(queue=Q).values_list("job_id", "state"))
    for start in range(0, len(ids), 5000):
        part = ids[start : start + 5000]
        for job_id, state in zip(part, storage.job_states(Q, part), strict=True):
            assert state is not None, job_id
            assert rows.get(job_id) == state.value, (job_id, rows.get(job_id), state)


def test_models_equal_redis_after_a_bulk_load_far_past_the_stream_cap(
    redis_client, redis_prefix, db_alias, tmp_path, settings
):
    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True}}
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=MAXLEN)
    spawn = spawner_for(tmp_path, db_alias, redis_prefix, settings.REDIS_URL)
    storage.register_queue(Q)
    storage.ensure_group(Q, GROUP)  # the mirror's place is kept from the first event on
    ids = [f"job-{i:06}" for i in range(JOBS)]
    try:
        reaper = spawn("runreaper", "--interval", "0.5", log="reaper")
        for start in range(0, JOBS, 5000):  # bulk, as a producer would
            jobs = [NewJob(i, b"{}", JobOptions()) for i in ids[start : start + 5000]]
            storage.enqueue_many(Q, jobs)
        # Held back (no worker yet), so certainly behind: health must say so.
        age, backlog = lag(storage, [Q])
        assert age > 0 and backlog > 0
        worker = spawn("runworker", Q, "-c", "16", log="worker")
        started = time.monotonic()

        def done() -> bool:
            return worker.poll() is not None or storage.counts(Q)[COMPLETED] >= JOBS

        assert wait_until(done, timeout=CONVERGE_S, interval=0.5), "the worker did not finish"
        assert worker.poll() is None, f"the worker exited; see {worker.log_path}"
        finished = time.monotonic()
        caught_up = wait_until(
            lambda: lag(storage, [Q]) == (0.0, 0)
            and Job.objects.using(db_alias).filter(queue=Q, state="completed").count() == JOBS,
            timeout=CONVERGE_S, interval=0.5,
        )  # fmt: skip
        assert caught_up, f"rows did not converge; see {reaper.log_path}"
        print(
            f"\n{JOBS} jobs: worker {JOBS / (finished - started):.0f} jobs/s; rows equal "
            f"Redis {time.monotonic() - finished:.1f} s after the last completion"
        )
        assert_rows_equal_redis(storage, db_alias, ids)
    finally:
        spawn.stop_all()
        # A quarter of a million keys: in slices, so no single DEL blocks the shared Redis.
        keys = list(redis_client.scan_iter(match="{" + redis_prefix + "*", count=5000))
        for start in range(0, len(keys), 1000):
            redis_client.unlink(*keys[start : start + 1000])


# -- a mirror killed mid-batch, and Redis restarted empty ---------------------------------------

PORT = 7321  # this suite's private range is 7320-7339


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of this test's own (no persistence), restartable empty: ``restart()``."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(subprocess.Popen(
            [binary, "--port", str(PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly",
             "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL,
        ))  # fmt: skip
        client = client_from_url(f"redis://127.0.0.1:{PORT}/0")
        assert wait_until(lambda: _pings(client), timeout=10)

    def restart() -> None:
        procs[-1].terminate()
        procs[-1].wait(10)
        start()

    start()
    yield restart
    for proc in procs:  # by PID
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


def test_a_mirror_killed_mid_batch_and_an_emptied_redis_converge(
    private_redis, db_alias, monkeypatch
):
    client = client_from_url(f"redis://127.0.0.1:{PORT}/0")
    storage = RedisStorage(client, prefix="conv")
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0)
    mirror.queues()
    storage.enqueue_many(Q, [NewJob(f"a{i}", b"{}", JobOptions()) for i in range(50)])
    original = mirror._store

    def killed(*args, **kwargs):
        original(*args, **kwargs)
        raise SystemExit("killed mid-batch")  # inside the transaction: rolled back

    monkeypatch.setattr(mirror, "_store", killed)
    with pytest.raises(SystemExit):
        mirror.run_once()
    monkeypatch.undo()
    assert not Job.objects.using(db_alias).filter(queue=Q).exists()

    private_redis()  # Redis comes back empty: records, streams and groups are gone
    client = client_from_url(f"redis://127.0.0.1:{PORT}/0")
    storage = RedisStorage(client, prefix="conv")
    storage.enqueue_many(Q, [NewJob(f"b{i}", b"{}", JobOptions()) for i in range(30)])
    [claimed] = storage.claim(Q, "w", 1, 30_000).jobs
    storage.complete(Q, claimed.job_id, claimed.token, b"1")

    restarted = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    restarted.drain()
    rows = dict(Job.objects.using(db_alias).filter(queue=Q).values_list("job_id", "state"))
    expected = {f"b{i}": "queued" for i in range(30)} | {claimed.job_id: "completed"}
    assert rows == expected
    assert storage.group_backlog(Q, GROUP) == (0, None)
    client.close()


def test_a_running_mirror_resyncs_after_redis_restarts(private_redis, db_alias):
    client = client_from_url(f"redis://127.0.0.1:{PORT}/0")
    storage = RedisStorage(client, prefix="conv")
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0)
    mirror.queues()
    storage.enqueue_many(Q, [NewJob("before", b"{}", JobOptions())])
    mirror.drain()
    private_redis()
    storage.enqueue_many(Q, [NewJob("after", b"{}", JobOptions())])  # reconnects
    mirror.run_once()  # notices the new server (its run_id) before it reads the lost group
    assert mirror.resyncs == 1
    mirror.drain()
    assert Job.objects.using(db_alias).get(queue=Q, job_id="after").state == "queued"
    client.close()
