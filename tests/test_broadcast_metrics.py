"""Prometheus gauges of broadcasts: per group lag, pending, dead and missed, on every backend,
and scoped like queues for an API key."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from django_jobq.broadcast import Broadcast
from django_jobq.observability.metrics.broadcasts import BroadcastCollector
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


def test_delivery_counters_per_group_and_outcome(live_storage):
    """Verdicts a subscriber worker sent, counted in its process: delivered (completed),
    retried and dead per group; labels are names and a fixed outcome set only."""
    from django_jobq.broadcast import Subscription
    from django_jobq.broadcast.subscribers import SubscriberWorker
    from django_jobq.observability.metrics import tally
    from django_jobq.observability.metrics.broadcasts import DeliveryCollector

    from .helpers import wait_until

    def fails(job):
        raise RuntimeError("no")

    tally.uninstall()
    counted = tally.install()
    bc = Broadcast("m-dl", storage=live_storage)
    subs = [Subscription("m-dl", "ok", lambda job: None, start="earliest"),
            Subscription("m-dl", "bad", fails, start="earliest", max_attempts=2, min_backoff=0,
                         max_backoff=0)]  # fmt: skip
    worker = SubscriberWorker(subs, storage=live_storage, concurrency=2, lease=5000, grace=0)
    worker.start()
    try:
        bc.publish_many([("a", 1), ("b", 2), ("c", 3)])
        assert wait_until(lambda: {s.group: s.dead for s in bc.status()}.get("bad") == 3, 30)
        assert wait_until(lambda: worker.stats["completed"] == 3, 30)
        total = "jobq_broadcast_deliveries_total"
        expected = {("ok", "completed"): 3, ("bad", "retried"): 3, ("bad", "dead"): 3}

        def counts() -> dict:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(DeliveryCollector(counted))
            found = samples(generate_latest(registry))
            return {(g, o): value(found, total, broadcast="m-dl", group=g, outcome=o)
                    for g, o in expected}  # fmt: skip

        # The worker counts a verdict after storage accepted it, so storage's dead count
        # can be ahead of the tally for a moment: wait for the tally itself.
        assert wait_until(lambda: counts() == expected, 30), counts()
        scoped = CollectorRegistry(auto_describe=False)
        scoped.register(DeliveryCollector(counted, {"elsewhere"}))
        assert not samples(generate_latest(scoped))
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(20)
        tally.uninstall()
