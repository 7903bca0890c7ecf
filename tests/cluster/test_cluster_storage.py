"""What the storage contract suite cannot show on its own: the steps that span queues owned by
different masters (multi-queue wake-ups, the mirror's read over many streams, flows), the
cluster URL, and that a wait ended by another slot's wake-up leaves no command blocked."""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings

from django_jobq import JobState
from django_jobq.backend import check_settings
from django_jobq.errors import ConfigurationError
from django_jobq.job import EnqueueOutcome, JobOptions, NewJob
from django_jobq.queue.flows import enqueue_flow, node, resolve_parked
from django_jobq.storage.redis.cluster import ClusterRedisStorage
from django_jobq.storage.redis.connection import client_from_url, cluster_client_from_url
from tests.contract.conftest import LONG_WAIT

from ..helpers import PATIENCE, wait_until
from .conftest import blocked_clients, spread_queues

pytestmark = [pytest.mark.redis_cluster]


def new_job(job_id: str) -> NewJob:
    return NewJob(job_id, b"{}", JobOptions())


def wait_in_thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_a_storage_on_a_cluster_client_is_the_cluster_variant(cstorage):
    assert isinstance(cstorage, ClusterRedisStorage)


def test_a_wait_over_queues_of_three_masters_wakes_on_any_of_them(
    redis_cluster, cstorage, wakeups_only
):
    queues = spread_queues(redis_cluster, cstorage, 3)
    for target in queues:
        for q in queues:
            cstorage.claim(q, "w1", 1, 30_000)  # the worker's empty claims come first
        before = sum(blocked_clients(redis_cluster).values())
        waiter = wait_in_thread(cstorage.wait_for_jobs, queues, LONG_WAIT, "w1")
        # One BLPOP per master, each blocked on its node, before anything is enqueued.
        assert wait_until(lambda b=before: sum(blocked_clients(redis_cluster).values()) >= b + 3)
        cstorage.enqueue(target, new_job(f"job-{target}"))
        waiter.join(PATIENCE)
        assert not waiter.is_alive(), f"an enqueue to {target} did not wake the wait"
        # The other masters' waits were ended too: no connection stays blocked behind it.
        assert wait_until(lambda b=before: sum(blocked_clients(redis_cluster).values()) == b)
        assert [j.job_id for j in cstorage.claim(target, "w1", 10, 30_000).jobs] == [
            f"job-{target}"
        ]


def test_interrupt_wait_ends_a_wait_over_several_masters(redis_cluster, cstorage, wakeups_only):
    queues = spread_queues(redis_cluster, cstorage, 3)
    before = sum(blocked_clients(redis_cluster).values())
    waiter = wait_in_thread(cstorage.wait_for_jobs, queues, LONG_WAIT, "w2")
    assert wait_until(lambda: sum(blocked_clients(redis_cluster).values()) >= before + 3)
    cstorage.interrupt_wait(queues, "w2")
    waiter.join(PATIENCE)
    assert not waiter.is_alive()
    assert wait_until(lambda: sum(blocked_clients(redis_cluster).values()) == before)


def test_a_quiet_multi_master_wait_lasts_its_timeout(redis_cluster, cstorage):
    queues = spread_queues(redis_cluster, cstorage, 3)
    done = threading.Event()
    waiter = wait_in_thread(lambda: (cstorage.wait_for_jobs(queues, 0.3, "w3"), done.set()))
    # Blocked on every master until the timeout ends every wait (the timeout is not a poll).
    assert wait_until(lambda: sum(blocked_clients(redis_cluster).values()) >= 3 or done.is_set())
    waiter.join(PATIENCE)
    assert done.is_set()


def test_the_mirror_read_over_streams_of_several_masters_blocks_and_wakes(
    redis_cluster, cstorage, wakeups_only
):
    queues = spread_queues(redis_cluster, cstorage, 3, stem="mq")
    for q in queues:
        assert cstorage.ensure_group(q, "mirror")
    cstorage.enqueue(queues[1], new_job("early"))
    first = cstorage.read_group(queues, "mirror", "m1", block=LONG_WAIT)
    assert [(e.queue, e.job_id) for e in first] == [(queues[1], "early")]

    got: list = []
    before = sum(blocked_clients(redis_cluster).values())
    reader = wait_in_thread(
        lambda: got.extend(cstorage.read_group(queues, "mirror", "m1", block=LONG_WAIT))
    )
    assert wait_until(lambda: sum(blocked_clients(redis_cluster).values()) >= before + 3)
    cstorage.enqueue(queues[2], new_job("late"))
    reader.join(PATIENCE)
    assert not reader.is_alive()
    assert [(e.queue, e.job_id) for e in got] == [(queues[2], "late")]
    assert wait_until(lambda: sum(blocked_clients(redis_cluster).values()) == before)
    # The unblocked reads took nothing: nothing is pending unread on the other streams.
    assert cstorage.read_group(queues, "mirror", "m1") == []
    assert cstorage.read_group(queues, "mirror", "m1", pending=True) != []  # not acked yet


def test_a_flow_across_queues_of_different_masters(redis_cluster, cstorage):
    a, b, parent_q = spread_queues(redis_cluster, cstorage, 3, stem="tests-flow-x")
    results = enqueue_flow(
        node(parent_q, "p", {}, children=[node(a, "c1", {}), node(b, "c2", {})]),
        storage=cstorage,
    )
    assert {r.outcome for r in results.values()} == {EnqueueOutcome.QUEUED}
    for q, jid in ((a, "c1"), (b, "c2")):
        assert resolve_parked(cstorage, parent_q) == 0
        (claimed,) = cstorage.claim(q, "w", 10, 30_000).jobs
        assert claimed.job_id == jid
        cstorage.complete(q, jid, claimed.token, b"1")
    assert resolve_parked(cstorage, parent_q) == 1
    assert cstorage.get_record(parent_q, "p").state is JobState.QUEUED


def test_server_id_names_every_master(cstorage):
    sid = cstorage.server_id()
    assert sid.startswith("cluster-") and sid.endswith("-3")
    assert cstorage.server_id() == sid


def test_redis_url_accepts_a_cluster_and_builds_its_storage(redis_cluster):
    from django_jobq import backend

    with override_settings(JOBQ={"REDIS_URL": redis_cluster.url}):
        assert check_settings() == []
        storage = backend.build_storage()
        try:
            assert isinstance(storage, ClusterRedisStorage)
            storage.register_queue("url-q")
            assert "url-q" in storage.list_queues()
        finally:
            storage.client.srem(storage.global_keys.queues, "url-q")
            storage.close()


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis+cluster://127.0.0.1", "is not host:port"),
        ("redis+cluster://127.0.0.1:7800,:7801", "is not host:port"),
        ("redis+cluster://127.0.0.1:7800/3", "only database 0"),
        ("redis+cluster:///", "is not host:port"),
    ],
)
def test_a_malformed_cluster_url_is_refused_clearly(url, fragment):
    with override_settings(JOBQ={"REDIS_URL": url}):
        assert any(fragment in p for p in check_settings())
    with pytest.raises(ConfigurationError, match=fragment.split()[0]):
        client_from_url(url)


def test_an_unknown_url_option_is_refused(redis_cluster):
    with pytest.raises(ConfigurationError, match="unknown option 'bogus'"):
        cluster_client_from_url(redis_cluster.url + "?bogus=1")


def test_a_django_redis_cache_alias_on_the_cluster_is_shared_with_the_storage(redis_cluster):
    from django.core.cache import caches

    from django_jobq import backend

    factory = "django_jobq.storage.redis.cluster_cache.ClusterConnectionFactory"
    cache_settings = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jq": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}",
            "OPTIONS": {"CONNECTION_FACTORY": factory},
        },
    }
    with override_settings(CACHES=cache_settings, JOBQ={"REDIS_CACHE_ALIAS": "jq"}):
        caches["jq"].set("cluster-cache-probe", 1, 30)
        assert caches["jq"].get("cluster-cache-probe") == 1
        storage = backend.build_storage()
        assert isinstance(storage, ClusterRedisStorage)
        storage.register_queue("alias-q")
        try:
            assert "alias-q" in storage.list_queues()
        finally:
            storage.client.srem(storage.global_keys.queues, "alias-q")
            caches["jq"].delete("cluster-cache-probe")
            caches["jq"].close()


def test_a_bulk_enqueue_of_one_slot_survives_a_script_flush(redis_cluster, cstorage):
    """One slot's calls are streamed on its master's own connection (``call_streamed``); a
    master without the scripts (a failover's new one, SCRIPT FLUSH) refuses them with
    NOSCRIPT, and they run again once the scripts are loaded, none twice."""
    for port in redis_cluster.masters():
        redis_cluster.node_cmd(port, "SCRIPT", "FLUSH")
    jobs = [new_job(f"j{i}") for i in range(250)]  # three calls of one slot
    out = cstorage.enqueue_many("flushed", jobs)
    assert [o.outcome for o in out] == [EnqueueOutcome.QUEUED] * 250
    assert cstorage.counts("flushed")[JobState.QUEUED] == 250
