"""The Redis backend's single-enqueue fast path: a lone job's script call is written to a pooled
connection already packed (``RedisStorage._packed_one``, ``Scripts.call_packed``).

What must hold: the bytes are exactly those redis-py would send for the same call, and the
path keeps the client's guarantees (scripts reloaded after SCRIPT FLUSH, a lost connection
retried, each job stored once), and the wake list never holds more than one marker.
"""

from __future__ import annotations

import datetime as dt
import select
import threading

import pytest
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobq import Queue
from django_jobq.job import AckOutcome, EnqueueOutcome, JobOptions, NewJob
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.redis import scripts as scripts_mod
from django_jobq.storage.redis.connection import client_from_url, pooled_connection
from django_jobq.storage.redis.scripts import SHAS
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import wait_until
from .private_redis import PrivateRedis

pytestmark = pytest.mark.redis

Q = "hot"


@pytest.fixture
def storage(redis_client, redis_prefix):
    return RedisStorage(redis_client, prefix=redis_prefix)


def redis_py_bytes(storage: RedisStorage, queue: str, job: NewJob) -> bytes:
    """What redis-py writes for the ordinary call of the same job."""
    _, keys, args = storage._enqueue_call(queue, [job])
    conn = pooled_connection(storage.client.connection_pool, "EVALSHA")
    try:
        packed = conn.pack_command("EVALSHA", SHAS["enqueue_one"], len(keys), *keys, *args)
    finally:
        storage.client.connection_pool.release(conn)
    return b"".join(packed)


job_ids = st.text("abcdefXYZ0123456789-_.:", min_size=1, max_size=40)
payloads = st.binary(max_size=300)
options = st.builds(
    JobOptions,
    max_attempts=st.integers(1, 50),
    result_ttl=st.integers(0, 10**10),
    min_backoff=st.integers(0, 10**6),
    max_backoff=st.integers(0, 10**7),
    max_stalls=st.integers(0, 9),
    priority=st.integers(-1000, 1000),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    job_id=job_ids,
    payload=payloads,
    opts=options,
    run_at=st.none() | st.integers(0, 2**42),
    delay=st.integers(0, 10**9),
    waiter=st.booleans(),
    ctype=st.sampled_from(["json", "msgpack", "json+env"]),
)
def test_a_lone_job_is_packed_as_redis_py_packs_its_call(
    storage, job_id, payload, opts, run_at, delay, waiter, ctype
):
    job = NewJob(job_id, payload, opts, run_at, delay, ctype, waiter)
    assert storage._packed_one(Q, job) == redis_py_bytes(storage, Q, job)
    # The second job of the same options reuses the kept head: still the same bytes.
    other = NewJob(job_id + "2", payload + b"!", opts, run_at, delay, ctype, waiter)
    assert storage._packed_one(Q, other) == redis_py_bytes(storage, Q, other)


def test_jobs_with_scheduling_options_or_an_injected_clock_take_the_ordinary_path(
    storage, redis_client, redis_prefix, clock
):
    queue = Queue(Q, storage=storage)
    for options in ({"lifo": True}, {"group": "g"}, {"singleton": True}, {"dedup_key": "d"},
                    {"update_data": True}):  # fmt: skip
        assert storage._packed_one(Q, queue.build("x", 1, **options)) is None
    clocked = RedisStorage(redis_client, prefix=redis_prefix, clock=clock)
    assert clocked._packed_one(Q, queue.build("x", 1)) is None
    assert storage._packed_one(Q, queue.build("x", 1)) is not None


def test_a_lone_enqueue_survives_a_script_flush(tmp_path):
    # On a server of its own: SCRIPT FLUSH on the shared one hits every test running beside it.
    server = PrivateRedis(tmp_path / "redis")
    try:
        _lone_enqueue_survives_a_script_flush(RedisStorage(server.client, prefix="flush"),
                                              server.client)  # fmt: skip
    finally:
        server.stop()


def _lone_enqueue_survives_a_script_flush(storage, redis_client):
    """The three kept packed heads (enqueue, an idle worker's wait-and-claim, a single
    completion) name scripts by SHA: each call after the flush loads its script again."""
    queue = Queue(Q, storage=storage)
    assert queue.enqueue("before", 1).outcome is EnqueueOutcome.QUEUED
    first = storage.wait_and_claim(Q, "w1", 1, 5_000, 5).jobs[0]
    done = storage.ack_many(Q, [Ack("complete", "before", first.token, b"1")])
    assert done == [AckOutcome.COMPLETED]
    assert storage._heads and storage._wait_heads and storage._ack_heads  # all packed paths
    redis_client.script_flush()
    assert queue.enqueue("after", 2).outcome is EnqueueOutcome.QUEUED
    assert queue.enqueue("after", 3).outcome is EnqueueOutcome.DUPLICATE
    assert storage.get_record(Q, "after").payload == b"2"
    assert storage.counts(Q)[JobState.QUEUED] == 1
    redis_client.script_flush()
    # The wait happened, its claim met NOSCRIPT: handed back (None) for the worker's own
    # claim, which loads the script; the next packed wait claims again.
    assert storage.wait_and_claim(Q, "w1", 1, 5_000, 5) is None
    assert [c.job_id for c in storage.claim(Q, "w1", 1, 5_000).jobs] == ["after"]
    queue.enqueue("later", 3)
    claimed = storage.wait_and_claim(Q, "w1", 1, 5_000, 5).jobs
    assert [c.job_id for c in claimed] == ["later"]
    redis_client.script_flush()
    done = storage.ack_many(Q, [Ack("complete", "later", claimed[0].token, b"3")])
    assert done == [AckOutcome.COMPLETED]
    assert storage.get_record(Q, "later").state is JobState.COMPLETED


def _kill(conn) -> None:
    """Have the server close ``conn`` (CLIENT KILL by its id) and wait until it has."""
    conn.send_command("CLIENT", "ID")
    conn_id = conn.read_response()
    admin = client_from_url(django_settings.REDIS_URL)
    try:
        admin.execute_command("CLIENT", "KILL", "ID", conn_id)
    finally:
        admin.close()
    # The raw socket, not conn.can_read: redis-py's check would notice the EOF and reconnect,
    # and the test is about a call that meets the closed socket.
    sock = conn._sock
    assert wait_until(lambda: select.select([sock], [], [], 0.01)[0]), "the server kept it"


def _count_ordinary_calls(storage: RedisStorage) -> list[str]:
    ordinary: list[str] = []
    real_call = storage.scripts.call

    def call(name, keys, args):
        ordinary.append(name)
        return real_call(name, keys, args)

    storage.scripts.call = call  # type: ignore[method-assign]
    return ordinary


def test_a_lone_enqueue_on_a_pooled_connection_the_server_closed_is_sent_again_once(
    redis_prefix,
):
    """The server closes the connection after the pool handed it out: the packed call fails
    on it and goes again the ordinary way (the client's retry), and the job is stored once."""
    client = client_from_url(django_settings.REDIS_URL)  # a pool of its own: nothing kept yet
    storage = RedisStorage(client, prefix=redis_prefix)
    queue = Queue(Q, storage=storage)
    queue._register()  # its SADD would otherwise be the first to take a pooled connection
    storage.scripts.load_all()
    pool = client.connection_pool
    real_get = pool.get_connection
    killed: list[bool] = []

    def get_then_kill(*args, **kwargs):
        conn = real_get(*args, **kwargs)
        if not killed:
            _kill(conn)
            killed.append(True)
        return conn

    ordinary = _count_ordinary_calls(storage)
    pool.get_connection = get_then_kill
    try:
        result = queue.enqueue("lost", {"n": 1})
    finally:
        del pool.get_connection
    assert killed, "the packed path did not take a pooled connection"
    assert ordinary == ["enqueue_one"], "the failed packed call was not sent again once"
    assert result.outcome is EnqueueOutcome.QUEUED
    assert storage.get_record(Q, "lost").state is JobState.QUEUED
    assert storage.counts(Q)[JobState.QUEUED] == 1
    client.close()


def test_a_lone_enqueue_on_the_kept_connection_the_server_closed_is_sent_again_once(
    storage, redis_client
):
    """The connection kept between packed calls was closed by the server while it waited
    (an idle timeout, CLIENT KILL): the next call fails on it, goes again the ordinary way
    once, and the job is stored once; the call after it is packed again."""
    queue = Queue(Q, storage=storage)
    queue.enqueue("warm", 0)
    kept = storage.scripts._kept
    assert kept is not None and kept.conns, "a lone enqueue kept no connection"
    _kill(kept.conns[-1]())
    ordinary = _count_ordinary_calls(storage)
    result = queue.enqueue("lost", {"n": 1})
    assert ordinary == ["enqueue_one"], "the failed packed call was not sent again once"
    assert result.outcome is EnqueueOutcome.QUEUED
    # The closed one went back to the pool, not to the kept ones: kept, it would be connected
    # again beside the pool's own, and each outage would leave one connection more.
    assert all(ref() is not None and ref()._sock is not None for ref in kept.conns)
    assert queue.enqueue("next", 2).outcome is EnqueueOutcome.QUEUED
    assert ordinary == ["enqueue_one"], "the call after the failure was not packed again"
    assert storage.counts(Q)[JobState.QUEUED] == 3
    assert storage.get_record(Q, "lost").payload == b'{"n":1}'


def test_lone_enqueues_keep_one_connection_per_pool_and_a_small_pool_none(redis_prefix):
    """Packed calls keep one connection out of a large pool, whatever the number of storages
    made on its client; a small pool (where one held back could starve another caller) keeps
    none; closing the client closes the kept one too, and the next call connects again."""
    client = client_from_url(django_settings.REDIS_URL)
    pool = client.connection_pool
    storages = [RedisStorage(client, prefix=redis_prefix) for _ in range(5)]
    for n, s in enumerate(storages * 3):
        assert Queue(Q, storage=s).enqueue(payload=n).outcome is EnqueueOutcome.QUEUED
    assert len(pool._in_use_connections) == 1
    client.close()
    assert Queue(Q, storage=storages[0]).enqueue(payload="again").created
    assert storages[0].counts(Q)[JobState.QUEUED] == 16
    client.close()

    small = client_from_url(django_settings.REDIS_URL, max_connections=4)
    s = RedisStorage(small, prefix=redis_prefix)
    assert Queue(Q, storage=s).enqueue(payload="small").created
    assert len(small.connection_pool._in_use_connections) == 0
    small.close()


# The child only enqueues and leaves by os._exit; pytest-xdist's threads hold no lock of ours.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_enqueues_on_its_own_connection_and_the_parent_keeps_its_own(
    storage, redis_client
):
    """A process forked after a packed call does not write to the parent's kept socket (two
    processes on one socket would read each other's replies): each side's next call gets
    its own answer."""
    import os

    queue = Queue(Q, storage=storage)
    queue.enqueue("parent-1", 1)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any test machinery
        code = 1
        try:
            answers = [queue.enqueue(f"child-{i}", i) for i in range(20)]
            code = 0 if all(a.created for a in answers) else 2
            os.write(write_end, b"%d" % code)
        finally:
            os._exit(code)
    os.close(write_end)
    parent = [queue.enqueue(f"parent-{i}", i) for i in range(2, 22)]
    _, status = os.waitpid(pid, 0)
    reported = os.read(read_end, 16)
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0 and reported == b"0"
    assert all(a.created and a.job_id == f"parent-{i}" for i, a in enumerate(parent, 2))
    assert storage.counts(Q)[JobState.QUEUED] == 41
    for i in range(20):
        assert storage.get_record(Q, f"child-{i}").payload == b"%d" % i


def test_the_wake_list_holds_one_marker_however_many_jobs_are_queued(storage, redis_client):
    queue = Queue(Q, storage=storage)
    for i in range(30):
        queue.enqueue(f"w{i}", i)
    queue.enqueue_many([(f"m{i}", i) for i in range(300)])
    queue.enqueue(run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert redis_client.llen(storage.keys(Q).wake) == 1
    # A claim that leaves work behind pushes the marker back: still one.
    redis_client.delete(storage.keys(Q).wake)
    storage.claim(Q, "w", 5, 30_000)
    assert redis_client.llen(storage.keys(Q).wake) == 1


class OrdinaryPath(RedisStorage):
    """The same backend with the packed path off: every lone job goes through enqueue.lua."""

    def _packed_one(self, queue: str, job: NewJob) -> bytes | None:
        return None


plain_steps = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "claim", "complete", "fail", "retry"]),
        st.sampled_from(["a", "b", "c", "d"]),  # few ids: duplicates are the point
        st.booleans(),  # waiter
        st.sampled_from([0, 60_000]),  # delay: queued or scheduled
        st.integers(-2, 2),  # priority
    ),
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=plain_steps)
def test_enqueue_one_gives_what_enqueue_gives_for_a_plain_job(redis_client, redis_prefix, steps):
    """The same steps on both paths: every enqueue answers the same, and the records, counts,
    waiter registrations and queued order end the same."""
    import uuid

    from django_jobq.storage.base import Ack

    run = uuid.uuid4().hex[:6]
    packed = RedisStorage(redis_client, prefix=f"{redis_prefix}-p{run}")
    ordinary = OrdinaryPath(redis_client, prefix=f"{redis_prefix}-o{run}")
    tokens: dict[tuple[int, str], int] = {}
    for kind, job_id, waiter, delay, priority in steps:
        answers = []
        for n, s in enumerate((packed, ordinary)):
            if kind == "enqueue":
                job = NewJob(job_id, b'{"p":%d}' % priority, JobOptions(priority=priority),
                             None, delay, "json", waiter)  # fmt: skip
                r = s.enqueue(Q, job)
                answers.append((r.outcome, r.job_id, r.state, r.result, r.error))
            elif kind == "claim":
                claimed = s.claim(Q, "w", 1, 30_000).jobs
                answers.append([j.job_id for j in claimed])
                for j in claimed:
                    tokens[n, j.job_id] = j.token
            elif (n, job_id) in tokens:
                token = tokens.pop((n, job_id))
                # Verdicts that no clock can change between the two paths' steps: a final
                # failure, or a retry due in an hour (a backoff of seconds could fall due
                # between one storage's claim and the other's on a loaded machine).
                verdict = {
                    "complete": Ack("complete", job_id, token, b'"r"'),
                    "fail": Ack("fail", job_id, token, b'{"t":"E"}', permanent=True),
                    "retry": Ack("fail", job_id, token, b'{"t":"E"}', retry_in=3_600_000),
                }[kind]
                answers.append(s.ack_many(Q, [verdict]))
        assert answers[0] == answers[1] if answers else True, (kind, job_id, answers)
    assert packed.counts(Q) == ordinary.counts(Q)
    # The queued line in the same order (sequence numbers may differ: enqueue.lua reserves
    # one for a duplicate too, and gaps do not change the order).
    line = [redis_client.zrange(s.keys(Q).queued, 0, -1) for s in (packed, ordinary)]
    assert line[0] == line[1]
    for job_id in "abcd":
        a, b = packed.get_record(Q, job_id), ordinary.get_record(Q, job_id)
        assert (a is None) == (b is None)
        if a is not None:
            fields = ("state", "attempts", "max_attempts", "priority", "payload", "result",
                      "error", "content_type", "result_ttl")  # fmt: skip
            assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
            waiters = [
                redis_client.hget(s.keys(Q).job(job_id), "waiters") for s in (packed, ordinary)
            ]
            assert waiters[0] == waiters[1]


# -- request/response and the idle wait on kept connections ---------------------------------


def _serve(storage: RedisStorage, jobs: int) -> tuple[threading.Thread, list[str]]:
    """A worker loop on the storage calls alone: claim on wake-up, answer with the job's id."""
    served: list[str] = []

    def run() -> None:
        while len(served) < jobs:
            batch = storage.wait_and_claim(Q, "w1", 1, 30_000, 1.0)
            for claimed in batch.jobs if batch is not None else []:
                body = b'"%s"' % claimed.job_id.encode()
                storage.ack_many(Q, [Ack("complete", claimed.job_id, claimed.token, body)])
                served.append(claimed.job_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, served


def _ask(storage: RedisStorage, job_id: str) -> object:
    job = NewJob(job_id, b"{}", JobOptions(), None, 0, "json", True)
    stored, outcome = storage.enqueue_and_wait(Q, job, 30)
    assert stored.outcome is EnqueueOutcome.QUEUED and outcome is not None, (stored, outcome)
    return outcome.result


def test_request_responses_and_idle_waits_take_no_connection_from_the_pool_once_warm(
    storage, redis_client
):
    """The caller's enqueue-and-BLPOP, the worker's BLPOP-and-claim and its verdict each
    reuse a kept connection (``Scripts.take``/``give``) instead of the pool's get/release
    (the pool's lock, counters, events and socket poll on every call); the pool never lends
    more than the ones kept and the one of each call in flight."""
    pool = redis_client.connection_pool
    thread, served = _serve(storage, 40)
    for i in range(10):  # warm: the kept connections are taken from the pool once
        assert _ask(storage, f"warm-{i}") == f'"warm-{i}"'.encode()
    taken: list[int] = []
    real_get = pool.get_connection

    def counting_get(*args, **kwargs):
        taken.append(1)
        return real_get(*args, **kwargs)

    pool.get_connection = counting_get
    try:
        for i in range(30):
            assert _ask(storage, f"job-{i}") == f'"job-{i}"'.encode()
    finally:
        del pool.get_connection
    thread.join(30)
    assert served[-30:] == [f"job-{i}" for i in range(30)]
    assert len(taken) == 0, f"{len(taken)} connections taken from the pool in 30 round trips"
    assert len(pool._in_use_connections) <= scripts_mod.KEEP_CONNECTIONS + 1


def test_request_response_and_idle_wait_on_kept_connections_the_server_closed(
    storage, redis_client
):
    """Every kept connection closed by the server while it waited (an idle timeout, CLIENT
    KILL): the next request/response still gets its own result, its job is stored and run
    once, and the worker's next wait claims on a fresh connection."""
    thread, served = _serve(storage, 3)
    assert _ask(storage, "first") == b'"first"'
    assert wait_until(lambda: len(storage.scripts._kept.conns) >= 1)
    # The worker is parked in its next wait on one kept connection; the others are idle.
    for ref in list(storage.scripts._kept.conns):
        conn = ref()
        if conn is not None:
            _kill(conn)
    assert _ask(storage, "second") == b'"second"'
    assert _ask(storage, "third") == b'"third"'
    thread.join(30)
    assert served == ["first", "second", "third"]
    for job_id in served:
        record = storage.get_record(Q, job_id)
        assert record.state is JobState.COMPLETED and record.attempts == 1
