"""Prometheus metrics: storage gauges on every backend, the process counters fed by the job
signals, and the Django view scraped over real HTTP with each way in (key, staff, address)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from django.conf import settings as django_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_jobq import JobFailed, PermanentError
from django_jobq.api.keys import create_key
from django_jobq.observability.metrics import tally
from django_jobq.observability.metrics.collectors import StorageCollector, TallyCollector
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until


def samples(text: str | bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    if isinstance(text, bytes):
        text = text.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def scrape_storage(storage, queues: list[str]) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StorageCollector(storage, queues=lambda _: queues))
    return samples(generate_latest(registry))


@pytest.fixture
def metrics():
    tally.uninstall()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TallyCollector(tally.install()))
    yield registry
    tally.uninstall()


def test_storage_gauges_after_a_known_workload(live_storage):
    q = Queue("m-depth", storage=live_storage)
    q.enqueue_many([("a", 1), ("b", 2), ("c", 3)])
    q.enqueue("later", 4, delay=600_000)
    batch = live_storage.claim("m-depth", "w1", 1, 60_000)
    live_storage.fail("m-depth", batch.jobs[0].job_id, batch.jobs[0].token, b"{}",
                      permanent=True)  # fmt: skip
    q.pause()
    found = scrape_storage(live_storage, ["m-depth"])
    assert value(found, "jobq_storage_up") == 1
    assert value(found, "jobq_queue_jobs", queue="m-depth", state="queued") == 2
    assert value(found, "jobq_queue_jobs", queue="m-depth", state="scheduled") == 1
    assert value(found, "jobq_queue_jobs", queue="m-depth", state="failed") == 1
    assert value(found, "jobq_queue_dead_letters", queue="m-depth") == 1
    assert value(found, "jobq_queue_failure_calls", queue="m-depth") == 0
    assert value(found, "jobq_queue_paused", queue="m-depth") == 1
    assert value(found, "jobq_queue_oldest_waiting_seconds", queue="m-depth") >= 0
    assert not any(dict(labels).get("job_id") for _, labels in found)  # never a job label


def test_a_claim_tells_how_long_each_job_waited(storage, clock):
    """What the wait histogram is fed: ms from the enqueue, or from the due time when later,
    to the claim, by the storage's clock, on every backend."""
    q = Queue("m-wait", storage=storage)
    q.enqueue("now", 1)
    q.enqueue("delayed", 2, delay=1000)
    clock.advance(1500)  # "now" waited 1.5 s; "delayed" was due after 1 s: waited 0.5 s
    waited = {c.job_id: c.waited_ms for c in storage.claim("m-wait", "w1", 5, 60_000).jobs}
    assert waited == {"now": 1500, "delayed": 500}
    # A retry waits from its backoff's due time, not from the first enqueue.
    q.enqueue("again", 3)
    (claimed,) = storage.claim("m-wait", "w1", 1, 60_000).jobs
    assert claimed.waited_ms == 0
    clock.advance(100)
    storage.fail("m-wait", claimed.job_id, claimed.token, b"{}", retry_in=2000)
    clock.advance(2000 + 300)  # due 2 s after the failure; claimed 0.3 s after that
    (retried,) = storage.claim("m-wait", "w1", 1, 60_000).jobs
    assert (retried.job_id, retried.attempt, retried.waited_ms) == ("again", 2, 300)


def test_oldest_waiting_is_zero_for_an_empty_queue_and_grows_while_one_waits(live_storage):
    q = Queue("m-age", storage=live_storage)
    assert value(scrape_storage(live_storage, ["m-age"]),
                 "jobq_queue_oldest_waiting_seconds", queue="m-age") == 0  # fmt: skip
    q.enqueue("waits", {})
    since = live_storage.oldest_queued("m-age")
    assert since is not None
    assert wait_until(
        lambda: value(scrape_storage(live_storage, ["m-age"]),
                      "jobq_queue_oldest_waiting_seconds", queue="m-age") > 0.05, 10,
    )  # fmt: skip


def test_workers_are_reported_with_their_slots_and_heartbeat_age(live_storage):
    live_storage.register_worker("w-metrics", {"in_flight": 3, "concurrency": 8}, 60_000)
    found = scrape_storage(live_storage, [])
    assert value(found, "jobq_worker_slots_busy", worker="w-metrics") == 3
    assert value(found, "jobq_worker_slots", worker="w-metrics") == 8
    assert 0 <= value(found, "jobq_worker_heartbeat_age_seconds", worker="w-metrics") < 60
    assert value(found, "jobq_workers") >= 1


def test_an_unreachable_storage_gives_storage_up_zero_not_an_error():
    from django_jobq.storage.redis.connection import client_from_url
    from django_jobq.storage.redis.storage import RedisStorage

    dead = RedisStorage(client_from_url("redis://127.0.0.1:7419/0"), prefix="nobody")
    found = scrape_storage(dead, ["q"])
    assert value(found, "jobq_storage_up") == 0
    assert not any(name.startswith("jobq_queue") for name, _ in found)


def test_process_counters_follow_the_job_signals(live_storage, metrics):
    handlers = HandlerRegistry()

    def run(job):
        if job.payload == "bad":
            raise PermanentError("no")
        return job.payload

    handlers.register("m-count", run)
    q = Queue("m-count", storage=live_storage)
    worker = Worker(["m-count"], storage=live_storage, handlers=handlers, lease=5000, grace=1)
    worker.start()
    try:
        for i in range(4):
            assert q.enqueue_and_wait(f"ok-{i}", i, timeout=20) == i
        with pytest.raises(JobFailed):
            q.enqueue_and_wait("bad", "bad", timeout=20)
        q.enqueue("ok-0", 0)  # a duplicate (completed)
        q.enqueue("gone", 1, delay=600_000)
        q.cancel("gone")

        def counted():
            return samples(generate_latest(metrics))

        assert wait_until(
            lambda: value(counted(), "jobq_jobs_failed_total", queue="m-count", handler="") == 1,
            10,
        )
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(20)
    found = counted()
    assert value(found, "jobq_jobs_enqueued_total", queue="m-count", outcome="queued") == 6
    assert value(found, "jobq_jobs_enqueued_total", queue="m-count", outcome="completed") == 1
    assert value(found, "jobq_jobs_started_total", queue="m-count", handler="") == 5
    assert value(found, "jobq_jobs_completed_total", queue="m-count", handler="") == 4
    assert value(found, "jobq_jobs_cancelled_total", queue="m-count") == 1
    assert value(found, "jobq_job_run_seconds_count", queue="m-count", handler="",
                 outcome="completed") == 4  # fmt: skip


# -- the Django view over HTTP (Redis backend, this test's own key prefix) ---------------------


@pytest.fixture
def served(settings, redis_prefix, live_server):
    settings.JOBQ = {**django_settings.JOBQ, "PREFIX": redis_prefix}
    q = Queue("m-view-a")
    q.enqueue_many([("a1", 1), ("a2", 2)])
    Queue("m-view-b").enqueue("b1", 1)
    return live_server.url + "/metrics/"


def get(url: str, key: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)  # noqa: S310 - the live server on loopback
    if key:
        request.add_header("Authorization", f"Api-Key {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_view_refuses_anonymous_scrapes(served):
    status, body = get(served)
    assert status == 401
    assert "API key" in body


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_view_serves_every_queue_to_a_key_with_read_on_all_queues(served):
    _, key = create_key("prom", queues=["*"], actions=["read"])
    status, body = get(served, key)
    assert status == 200
    found = samples(body)
    assert value(found, "jobq_queue_jobs", queue="m-view-a", state="queued") == 2
    assert value(found, "jobq_queue_jobs", queue="m-view-b", state="queued") == 1


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_queue_scoped_key_sees_only_its_queues(served):
    _, key = create_key("team-a", queues=["m-view-a"], actions=["read"])
    status, body = get(served, key)
    assert status == 200
    found = samples(body)
    assert value(found, "jobq_queue_jobs", queue="m-view-a", state="queued") == 2
    assert not any(dict(labels).get("queue") == "m-view-b" for _, labels in found)
    assert not any("worker" in dict(labels) for _, labels in found)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_key_without_read_or_an_unknown_key_is_refused(served):
    _, key = create_key("writer", queues=["*"], actions=["enqueue"])
    assert get(served, key)[0] == 403
    assert get(served, "jobq_deadbeef_nope")[0] == 401


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_an_allowed_address_needs_no_credentials(served, settings):
    settings.JOBQ = {**settings.JOBQ, "METRICS": {"ALLOWED_IPS": ["127.0.0.0/8"]}}
    status, body = get(served)
    assert status == 200
    assert value(samples(body), "jobq_queue_jobs", queue="m-view-a", state="queued") == 2


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_staff_session_may_scrape_and_a_plain_user_may_not(served, client,
                                                              django_user_model):  # fmt: skip
    plain = django_user_model.objects.create_user("plain", password="x")  # noqa: S106
    client.force_login(plain)
    assert client.get("/metrics/").status_code == 401
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)  # noqa: S106
    client.force_login(staff)
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert value(samples(response.content), "jobq_queue_jobs", queue="m-view-a",
                 state="queued") == 2  # fmt: skip


def test_a_sharded_queue_is_reported_once_under_its_logical_name(live_storage, metrics):
    """Its partitions' gauges are summed (oldest waiting: the oldest of any partition) and the
    process counters of jobs claimed from partitions are folded into the logical name."""
    from django_jobq.observability.metrics.tally import current
    from django_jobq.validation import partition_names

    q = Queue("m-shard", storage=live_storage, shards=3)
    q.enqueue_many([(f"s{i}", i) for i in range(9)])
    names = partition_names("m-shard", 3)
    assert sum(live_storage.counts(n)["queued"] for n in names) == 9
    assert len([n for n in names if live_storage.counts(n)["queued"]]) >= 2  # really spread
    found = scrape_storage(live_storage, names)
    assert value(found, "jobq_queue_jobs", queue="m-shard", state="queued") == 9
    assert value(found, "jobq_queue_oldest_waiting_seconds", queue="m-shard") >= 0
    assert value(found, "jobq_queue_paused", queue="m-shard") == 0
    assert not any(dict(labels).get("queue", "").startswith("m-shard~") for _, labels in found)

    for name in names:
        current().started(name, 2, [5, 5])
    folded = samples(generate_latest(metrics))
    started = [
        v for (name, labels), v in folded.items()
        if name == "jobq_jobs_started_total" and dict(labels)["queue"] == "m-shard"
    ]  # fmt: skip
    assert started == [6]
    assert not any(dict(labels).get("queue", "").startswith("m-shard~") for _, labels in folded)


@pytest.mark.redis
@pytest.mark.django_db(databases=["default", "pg"])
@pytest.mark.parametrize("alias", ["default", "pg"])
def test_a_scrape_of_many_queues_costs_round_trips_per_chunk_not_per_queue(
    redis_client, redis_prefix, settings, monkeypatch, alias
):
    """Issue 36, item 12: /metrics at 10,000 queues took 38.5 s (six Redis round trips and one
    database query a queue: past Prometheus's 10 s). Now the queue gauges are two pipelined
    round trips and the mirror lag one statement and one events read per 500 queues.
    Counted, not timed: 1,200 queues, the mirror on."""
    import redis

    from django_jobq.job import JobOptions, NewJob
    from django_jobq.storage.redis.storage import RedisStorage

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix,
                     "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": alias}}  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    names = [f"many{i:04}" for i in range(1200)]
    pipe = redis_client.pipeline(transaction=False)
    for name in names:  # registered, one job each: as enqueues leave them
        pipe.sadd(storage.global_keys.queues, name)
    pipe.execute()
    for name in names[:50]:
        storage.enqueue(name, NewJob("a", b"{}", JobOptions()))
    trips = {"redis": 0, "sql": 0}
    command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute

    def one(self, *args, **kwargs):
        trips["redis"] += 1
        return command(self, *args, **kwargs)

    def batch(self, *args, **kwargs):
        trips["redis"] += 1
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", one)
    monkeypatch.setattr(redis.client.Pipeline, "execute", batch)
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connections[alias]) as queries:
        found = scrape_storage(storage, names)
    trips["sql"] = len(queries)
    assert value(found, "jobq_queue_jobs", queue="many0001", state="queued") == 1
    assert value(found, "jobq_queue_jobs", queue="many1100", state="queued") == 0
    assert value(found, "jobq_mirror_lag_seconds", queue="many1100") == 0
    assert value(found, "jobq_mirror_lag_seconds", queue="many0001") is not None
    assert trips["redis"] <= 20 and trips["sql"] <= 6, trips


def test_queue_summaries_answer_what_the_one_queue_reads_answer(live_storage):
    """``queue_summaries`` (pipelined on Redis) against the per-queue reads it replaces, on
    every backend: waiting, running, delayed, failed, paused and empty queues."""
    names = ["sum-a", "sum-b", "sum-c"]
    a, b = Queue("sum-a", storage=live_storage), Queue("sum-b", storage=live_storage)
    a.enqueue_many([(f"j{i}", i) for i in range(5)])
    a.enqueue("later", 1, delay=60_000)
    b.enqueue("x", 1, max_attempts=1)
    claimed = live_storage.claim("sum-b", "w", 1, 30_000).jobs[0]
    live_storage.fail("sum-b", claimed.job_id, claimed.token, b'{"type": "E"}', permanent=True)
    live_storage.claim("sum-a", "w", 2, 30_000)
    b.pause()
    got = live_storage.queue_summaries(names)
    for name in names:
        s = got[name]
        assert s.counts == live_storage.counts(name)
        assert s.oldest_queued == live_storage.oldest_queued(name)
        assert s.dead == live_storage.count_dead(name)
        assert s.failure_calls == live_storage.count_failure_calls(name)
        assert s.paused == live_storage.is_paused(name)
    assert got["sum-b"].paused and got["sum-b"].dead == 1 and got["sum-a"].counts
