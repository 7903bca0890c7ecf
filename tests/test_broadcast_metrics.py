"""Prometheus gauges of broadcasts: per group lag, pending, dead and missed, on every backend,
and scoped like queues for an API key."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from django_jobq.broadcast import Broadcast
from django_jobq.metrics.broadcasts import BroadcastCollector
from django_jobq.storage.broadcast_base import Settle, SettleKind

from .test_metrics import samples, value


def scrape(storage, names=None) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BroadcastCollector(names, storage=storage))
    return samples(generate_latest(registry))


def test_group_gauges_show_lag_pending_dead_and_a_group_that_fell_behind(live_storage):
    bc = Broadcast("m-bc", storage=live_storage, maxlen=3)
    bc.subscribe("fast", start="earliest")
    bc.subscribe("slow", start="earliest")
    bc.publish_many([("a", 1), ("b", 2)])
    store = bc.store
    a, b = store.claim("m-bc", "fast", "w", 2, 60_000, 1)
    store.settle("m-bc", "fast", [Settle(SettleKind.DEAD, a.position, a.token, error=b"{}")])
    bc.publish_many([("c", 3), ("d", 4)])  # drops a: slow never read it
    found = scrape(live_storage)
    assert value(found, "jobq_broadcast_messages", broadcast="m-bc") == 3
    assert value(found, "jobq_broadcast_group_lag", broadcast="m-bc", group="fast") == 2
    assert value(found, "jobq_broadcast_group_pending", broadcast="m-bc", group="fast") == 1
    assert value(found, "jobq_broadcast_group_dead", broadcast="m-bc", group="fast") == 1
    assert value(found, "jobq_broadcast_group_missed", broadcast="m-bc", group="slow") == 1
    assert value(found, "jobq_broadcast_group_missed", broadcast="m-bc", group="fast") == 0


def test_a_scoped_scrape_sees_only_its_broadcasts(live_storage):
    Broadcast("m-mine", storage=live_storage).subscribe("g")
    Broadcast("m-other", storage=live_storage).subscribe("g")
    found = scrape(live_storage, {"m-mine"})
    assert value(found, "jobq_broadcast_group_lag", broadcast="m-mine", group="g") == 0
    assert not any(dict(labels).get("broadcast") == "m-other" for _, labels in found)
