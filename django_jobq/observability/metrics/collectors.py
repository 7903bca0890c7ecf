"""Gauges read at scrape time: from the storage (shared state) and from a running worker.

A scrape costs, per queue, the backend's ``counts`` plus one read each for the oldest queued
job, dead letters, failure calls and the paused flag (Redis: a few O(1)/O(log n) commands;
database: indexed aggregates), and one read of the worker registry. When storage does not
answer the scrape still succeeds, with ``jobq_storage_up 0`` and no storage series, so an
alert can tell "queue empty" from "cannot see the queue".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...backend import get_storage
from ...conf import jobq_settings
from ...errors import EventsLost
from ...storage.base import Storage
from ...tasks.registry import handler_name, registry
from ...validation import logical_name
from . import prometheus
from .tally import RUN_BUCKETS, WAIT_BUCKETS, Tally

if TYPE_CHECKING:
    from ...broadcast.subscribers import SubscriberWorker
    from ...worker.core import Worker

logger = logging.getLogger("django_jobq.metrics")


def _gauge_family() -> Any:
    prometheus()  # the clear error when the extra is missing
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily


# Tally counter -> (metric name, help, label names after "queue"; "handler" added for these).
COUNTERS = {
    "enqueued": ("jobq_jobs_enqueued", "Enqueue calls answered here, by outcome", ["outcome"]),
    "started": ("jobq_jobs_started", "Attempts claimed by this process", []),
    "completed": ("jobq_jobs_completed", "Jobs completed here", []),
    "failed": ("jobq_jobs_failed", "Jobs failed for good here", []),
    "retried": ("jobq_jobs_retried", "Failed attempts here that will run again", []),
    "cancelled": ("jobq_jobs_cancelled", "Jobs cancelled (waiting, or running here)", []),
    "stalled": ("jobq_jobs_stalled", "Expired leases this process's sweeps found", ["outcome"]),
}
WITH_HANDLER = frozenset({"started", "completed", "failed", "retried"})


class TallyCollector:
    """The process's counters and run-time histogram (``tally.py``), built when scraped."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        prometheus()
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        counts, runs = _logical_counts(self.tally.snapshot())
        families = {}
        for key, (name, doc, extra) in COUNTERS.items():
            names = ["queue", *(["handler"] if key in WITH_HANDLER else []), *extra]
            families[key] = CounterMetricFamily(name, doc, labels=names)
        for (key, values), n in sorted(counts.items()):
            queue, rest = values[0], list(values[1:])
            handler = [handler_name(queue)] if key in WITH_HANDLER else []
            families[key].add_metric([queue, *handler, *rest], n)
        yield from families.values()
        hist = HistogramMetricFamily(
            "jobq_job_run_seconds", "Seconds from claim to verdict of each attempt here",
            labels=["queue", "handler", "outcome"],
        )  # fmt: skip
        for (queue, outcome), (buckets, total) in sorted(runs.items()):
            cumulative = _cumulative(RUN_BUCKETS, buckets)
            hist.add_metric([queue, handler_name(queue), outcome], cumulative, total)
        yield hist
        waits = HistogramMetricFamily(
            "jobq_job_wait_seconds",
            "Seconds from enqueue (or due time, when later) to the claim of each attempt here",
            labels=["queue", "handler"],
        )
        for queue, (buckets, total) in sorted(_logical_waits(self.tally.wait_snapshot()).items()):
            waits.add_metric(
                [queue, handler_name(queue)], _cumulative(WAIT_BUCKETS, buckets), total
            )
        yield waits


def _logical_counts(snapshot: tuple[dict, dict]) -> tuple[dict, dict]:
    """The tally with a sharded queue's partitions folded into its logical name: a dashboard
    asks about ``orders``, not about ``orders~2of3`` (docs/scaling.md)."""
    counts, runs = snapshot
    folded: dict = {}
    for (key, values), n in counts.items():
        name = (key, (logical_name(values[0]), *values[1:]))
        folded[name] = folded.get(name, 0) + n
    return folded, {
        (logical, outcome): hist
        for (logical, outcome), hist in _fold_histograms(
            ((logical_name(queue), outcome), hist) for (queue, outcome), hist in runs.items()
        ).items()
    }


def _logical_waits(waits: dict) -> dict:
    return _fold_histograms((logical_name(queue), hist) for queue, hist in waits.items())


def _fold_histograms(items: Iterable[tuple[Any, list]]) -> dict:
    """Sum [bucket counts, sum of seconds] histograms that share a key."""
    out: dict = {}
    for key, (buckets, total) in items:
        have = out.get(key)
        if have is None:
            out[key] = [list(buckets), total]
        else:
            have[0] = [a + b for a, b in zip(have[0], buckets, strict=True)]
            have[1] += total
    return out


def _cumulative(bounds: tuple[float, ...], buckets: list[int]) -> list[tuple[str, int]]:
    """Per-bucket counts as Prometheus's cumulative (le, count) pairs, +Inf last."""
    cumulative, running = [], 0
    for bound, n in zip([*map(str, bounds), "+Inf"], buckets, strict=True):
        running += n
        cumulative.append((bound, running))
    return cumulative


def known_queues(storage: Storage) -> list[str]:
    """Queues enqueued to, with a handler here, or named in the settings (as the reaper)."""
    names = set(storage.list_queues()) | set(registry.queues())
    return sorted(names | set(jobq_settings()["QUEUES"]))


LAG_CHUNK = 500  # queues per statement and per events read of the mirror-lag gauge


class StorageCollector:
    """Queue and worker gauges of one storage, read when collected.

    Args:
        storage: the storage to read (default: the configured one, looked up per scrape).
        queues: a callable returning the queue names to report (default: every known queue);
            the view narrows it to an API key's queues.
    """

    def __init__(
        self,
        storage: Storage | None = None,
        queues: Callable[[Storage], Iterable[str]] | None = None,
    ) -> None:
        self._storage = storage
        self._queues = queues or known_queues

    def describe(self) -> list[Any]:
        return []  # collected on demand only: registering must not read storage

    def collect(self) -> Iterator[Any]:
        g = _gauge_family()
        up = g("jobq_storage_up", "1 when the storage answered this scrape")
        storage = self._storage or get_storage()
        try:
            families = self._read(storage, g)
        except Exception as exc:  # storage down: report that instead of failing the scrape
            logger.warning("metrics: storage not readable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self, storage: Storage, g: Any) -> list[Any]:
        depth = g("jobq_queue_jobs", "Jobs per state (completed/failed: the backend's totals)",
                  labels=["queue", "state"])  # fmt: skip
        oldest = g("jobq_queue_oldest_waiting_seconds",
                   "Seconds the job first in line has been runnable (0: none queued)",
                   labels=["queue"])  # fmt: skip
        dead = g("jobq_queue_dead_letters", "Jobs failed for good, still listed",
                 labels=["queue"])  # fmt: skip
        calls = g("jobq_queue_failure_calls", "Failure-handler calls not done yet",
                  labels=["queue"])  # fmt: skip
        paused = g("jobq_queue_paused", "1 when the queue is paused", labels=["queue"])
        now = time.time() * 1000
        # A sharded queue is reported once, under its logical name: its partitions' counts
        # summed, the oldest waiting job of any, paused when any partition is.
        groups: dict[str, list[str]] = {}
        for name in self._queues(storage):
            groups.setdefault(logical_name(name), []).append(name)
        summaries = storage.queue_summaries([n for names in groups.values() for n in names])
        for logical, names in groups.items():
            parts = [summaries[n] for n in names]
            states: dict[str, int] = {}
            for part in parts:
                for found, n in part.counts.items():
                    states[str(found)] = states.get(str(found), 0) + n
            for label, n in states.items():
                depth.add_metric([logical, label], n)
            firsts = [p.oldest_queued for p in parts if p.oldest_queued is not None]
            oldest.add_metric([logical], max(0.0, (now - min(firsts)) / 1000) if firsts else 0.0)
            dead.add_metric([logical], sum(p.dead for p in parts))
            calls.add_metric([logical], sum(p.failure_calls for p in parts))
            paused.add_metric([logical], int(any(p.paused for p in parts)))
        families = [depth, oldest, dead, calls, paused, *self._workers(storage, g, now)]
        lag = self._mirror_lag(storage, g, now)
        return families if lag is None else [*families, lag, self._lost(g)]

    @staticmethod
    def _lost(g: Any) -> Any:
        """Accepted jobs Redis lost before they finished (rows the mirror marked ``lost``,
        until retention purges them): one grouped read of a partial index of those rows."""
        from django.db.models import Count

        from ...models import Job

        lost = g("jobq_jobs_lost", "Accepted jobs Redis lost before they finished (mirror rows)",
                 labels=["queue"])  # fmt: skip
        rows = Job.objects.using(jobq_settings()["MIRROR"]["DATABASE_ALIAS"])
        totals: dict[str, int] = {}
        grouped = rows.filter(state="lost").values("queue").annotate(n=Count("id")).order_by()
        for row in grouped:
            logical = logical_name(row["queue"])
            totals[logical] = totals.get(logical, 0) + row["n"]
        for logical, n in totals.items():
            lost.add_metric([logical], n)
        return lost

    @staticmethod
    def _workers(storage: Storage, g: Any, now: float) -> list[Any]:
        live = g("jobq_workers", "Live workers (registered, heartbeat not expired)")
        age = g("jobq_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat",
                labels=["worker"])  # fmt: skip
        busy = g("jobq_worker_slots_busy", "Jobs the worker holds", labels=["worker"])
        slots = g("jobq_worker_slots", "Jobs the worker may hold at once", labels=["worker"])
        workers = storage.list_workers()
        live.add_metric([], len(workers))
        for w in workers:
            age.add_metric([w.worker_id], max(0.0, (now - w.last_seen) / 1000))
            busy.add_metric([w.worker_id], w.info.get("in_flight", 0))
            slots.add_metric([w.worker_id], w.info.get("concurrency", 0))
        return [live, age, busy, slots]

    def _mirror_lag(self, storage: Storage, g: Any, now: float) -> Any | None:
        """Age of the oldest stream event the model mirror has not written (Redis with the
        mirror on): one indexed row read and one XREAD per queue."""
        conf = jobq_settings()["MIRROR"]
        if not hasattr(storage, "read_group") or not conf["ENABLED"]:
            return None
        from ...models import JobEvent

        lag = g("jobq_mirror_lag_seconds", "Age of the oldest event not yet mirrored",
                labels=["queue"])  # fmt: skip
        alias = conf["DATABASE_ALIAS"]
        ages: dict[str, float] = {}
        names = list(self._queues(storage))
        for start in range(0, len(names), LAG_CHUNK):  # two reads a chunk, not two a queue
            chunk = names[start : start + LAG_CHUNK]
            after = {n: last or "0" for n, last in last_mirrored(JobEvent, alias, chunk).items()}
            try:
                pending = storage.read_events_many(after, count=1)
            except EventsLost:  # a last row's event was trimmed: read that chunk one by one
                pending = {n: _pending(storage, n, a) for n, a in after.items()}
            for name, events in pending.items():
                age = max(0.0, (now - events[0].at) / 1000) if events else 0.0
                logical = logical_name(name)  # a sharded queue: its most lagging partition
                ages[logical] = max(ages.get(logical, 0.0), age)
        for logical, age in ages.items():
            lag.add_metric([logical], age)
        return lag


def _pending(storage: Storage, name: str, after: str) -> list[Any]:
    try:
        return storage.read_events(name, after=after, count=1)
    except EventsLost:  # the last row's event was trimmed: the oldest kept is behind
        return storage.read_events(name, after="0", count=1)


def last_mirrored(model: Any, alias: str, queues: Sequence[str]) -> dict[str, str | None]:
    """The stream id of each queue's newest mirrored event row (None: none): one statement
    for all of them, each a backward walk of the (queue, id) index that stops at its first
    row with a stream id, as the per-queue query it replaces did."""
    from django.db import connections

    if not queues:
        return {}
    table = connections[alias].ops.quote_name(model._meta.db_table)
    names = " UNION ALL ".join(["SELECT %s AS name"] * len(queues))
    # The table name is the model's, quoted; every value is a parameter.
    sql = (
        f"SELECT q.name, (SELECT e.stream_id FROM {table} e WHERE e.queue = q.name"  # noqa: S608
        f" AND e.stream_id <> '' ORDER BY e.id DESC LIMIT 1) FROM ({names}) q"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, list(queues))
        return dict(cursor.fetchall())


class WorkerCollector:
    """A running worker's own gauges, for its ``--metrics-port`` endpoint."""

    def __init__(self, worker: Worker | SubscriberWorker) -> None:
        self.worker = worker

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        g = _gauge_family()
        w = self.worker
        snapshot = w.metrics_snapshot()
        for name, doc, value in (
            ("jobq_worker_slots", "Jobs this worker may hold at once", snapshot["slots"]),
            ("jobq_worker_slots_busy", "Jobs this worker holds now", snapshot["busy"]),
            ("jobq_worker_heartbeat_age_seconds",
             "Seconds since this worker's last successful heartbeat (-1: none yet)",
             snapshot["heartbeat_age"]),
        ):  # fmt: skip
            family = g(name, doc, labels=["worker"])
            family.add_metric([w.worker_id], value)
            yield family
