"""Broadcast gauges read at scrape time: per subscriber group, lag, pending, dead letters and
``missed`` (messages retention dropped before the group handled them: a group that fell
behind); and the verdicts this process's subscriber workers sent, per group and outcome
(``jobq_broadcast_deliveries_total``: the delivered and failed counts). Labels: broadcast, group
and outcome (all bounded: names and a fixed set, never message ids)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ...backend import get_storage
from . import prometheus
from .tally import Tally
from .tally import current as current_tally

logger = logging.getLogger("django_jobq.metrics")


class BroadcastCollector:
    """Gauges of every broadcast, or of ``names`` only (an API key's scopes name broadcasts
    as they name queues)."""

    def __init__(self, names: set[str] | None = None, storage: Any = None) -> None:
        self.names, self._storage = names, storage

    def describe(self) -> list[Any]:
        return []  # collected on demand only: registering must not read storage

    def collect(self) -> Iterator[Any]:
        prometheus()
        from prometheus_client.core import GaugeMetricFamily as G

        store = (self._storage or get_storage()).broadcasts()
        labels = ["broadcast", "group"]
        length = G("jobq_broadcast_messages", "Messages retained", labels=["broadcast"])
        lag = G("jobq_broadcast_group_lag", "Messages the group has not read yet", labels=labels)
        pending = G(
            "jobq_broadcast_group_pending",
            "Messages read and not yet handled (active + retrying)",
            labels=labels,
        )
        dead = G("jobq_broadcast_group_dead", "Dead letters of the group", labels=labels)
        missed = G("jobq_broadcast_group_missed",
                   "Messages dropped by retention before the group handled them (> 0: it fell "
                   "behind)", labels=labels)  # fmt: skip
        try:
            for name in store.names():
                if self.names is not None and name not in self.names:
                    continue
                length.add_metric([name], store.length(name))
                for s in store.status(name):
                    lag.add_metric([name, s.group], s.lag)
                    pending.add_metric([name, s.group], s.pending)
                    dead.add_metric([name, s.group], s.dead)
                    missed.add_metric([name, s.group], s.missed)
        except NotImplementedError:
            return  # a storage without broadcasts
        except Exception as exc:  # storage down: jobq_storage_up says so already
            logger.warning("metrics: broadcasts not readable: %s", exc)
            return
        yield from (length, lag, pending, dead, missed)
        yield from DeliveryCollector(current_tally(), self.names).collect()


class DeliveryCollector:
    """Verdicts on subscriber deliveries counted in this process (``Tally.delivered``):
    ``completed`` (delivered), ``retried``, ``dead`` (failed for good), ``released``, ``lost``
    (a verdict refused because the lease had moved on). Reads no storage, so a worker's own
    ``--metrics-port`` endpoint serves it too."""

    def __init__(self, tally: Tally | None, names: set[str] | None = None) -> None:
        self.tally, self.names = tally, names

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        if self.tally is None:
            return
        prometheus()
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "jobq_broadcast_deliveries",
            "Verdicts on subscriber deliveries sent by this process, per group and outcome",
            labels=["broadcast", "group", "outcome"],
        )
        with self.tally._lock:
            counts = sorted(self.tally.deliveries.items())
        for (name, group, outcome), n in counts:
            if self.names is None or name in self.names:
                family.add_metric([name, group, outcome], n)
        yield family
