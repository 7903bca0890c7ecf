"""The reaper: recovers stalled jobs and promotes due ones on every known queue.

Each sweep is one atomic storage call per queue, so any number of reapers (and workers, which
sweep their own queues too) can run at once without double-handling a job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from .conf import get_storage, jobq_settings
from .registry import registry
from .storage.base import ReapReport, Storage

logger = logging.getLogger("django_jobq.reaper")


class Reaper:
    def __init__(
        self,
        queues: Sequence[str] | None = None,
        *,
        storage: Storage | None = None,
        interval: float | None = None,
        batch: int | None = None,
        mirror: bool | None = None,
        retention_days: float | None = -1,
    ) -> None:
        conf = jobq_settings()
        self.storage = storage if storage is not None else get_storage()
        self.fixed_queues = list(queues) if queues else None
        self.interval = conf["REAPER"]["interval"] if interval is None else interval
        self.batch = batch or conf["REAPER"]["batch"]
        self._stop = threading.Event()
        # The model mirror rides along by default where there is one to run (Redis backend).
        want_mirror = conf["MIRROR"]["ENABLED"] if mirror is None else mirror
        self.mirror: Any = None
        if want_mirror and hasattr(self.storage, "read_group"):
            from .mirror import Mirror

            self.mirror = Mirror(self.storage, queues=self.fixed_queues)
        self.retention_days = conf["RETENTION_DAYS"] if retention_days == -1 else retention_days
        self.retention_interval = 60.0
        self._last_purge = 0.0

    def queues(self) -> list[str]:
        """Explicit queues, else every queue that was enqueued to, has a handler or settings."""
        if self.fixed_queues:
            return self.fixed_queues
        known = set(self.storage.list_queues()) | set(registry.queues())
        known |= set(jobq_settings()["QUEUES"])
        return sorted(known)

    def run_once(self) -> dict[str, ReapReport]:
        reports = {}
        for name in self.queues():
            report = self.storage.reap(name, self.batch)
            # A full batch means more may be waiting: sweep again before sleeping.
            while len(report.requeued) + len(report.failed) + report.promoted >= self.batch:
                more = self.storage.reap(name, self.batch)
                report.requeued += more.requeued
                report.failed += more.failed
                report.promoted += more.promoted
                if len(more.requeued) + len(more.failed) + more.promoted < self.batch:
                    break
            for job_id in report.requeued:
                logger.warning("[%s/%s] lease expired: requeued (stalled)", name, job_id)
            for job_id in report.failed:
                logger.error("[%s/%s] lease expired past max_stalls: failed", name, job_id)
            if report.promoted:
                logger.debug("%s: promoted %d due jobs", name, report.promoted)
            reports[name] = report
        return reports

    def purge(self) -> int:
        """Delete job rows past the retention period (mirror rows, or database-backend state
        whose deduplication window has closed)."""
        from .mirror import purge_finished

        self._last_purge = time.monotonic()
        if self.retention_days is None:
            return 0
        alias = getattr(self.storage, "using", None) or jobq_settings()["MIRROR"]["DATABASE_ALIAS"]
        n = purge_finished(self.retention_days, using=alias)
        if n:
            logger.info(
                "retention: deleted %d finished jobs older than %s days", n, self.retention_days
            )
        return n

    def run(self) -> None:
        logger.info("reaper sweeping every %.2fs", self.interval)
        mirror_thread = self.mirror.start() if self.mirror is not None else None
        try:
            while not self._stop.is_set():
                try:
                    self.run_once()
                    if time.monotonic() - self._last_purge >= self.retention_interval:
                        self.purge()
                except Exception as exc:  # storage down: keep trying, never exit on a blip
                    logger.warning("reaper sweep failed: %s", exc)
                self._stop.wait(self.interval)
        finally:
            if mirror_thread is not None:
                self.mirror.stop()
                mirror_thread.join(timeout=10)

    def stop(self) -> None:
        self._stop.set()
