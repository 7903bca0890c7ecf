"""Broadcast gauges read at scrape time: per subscriber group, lag, pending, dead letters and
``missed`` (messages retention dropped before the group handled them: a group that fell
behind). Labels: broadcast and group (both bounded: names, never message ids)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ..conf import get_storage
from . import prometheus

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
