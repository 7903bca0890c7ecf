"""The reaper: recovers stalled jobs and promotes due ones on every known queue, and fires
due periodic schedules.

Each sweep is one atomic storage call per queue, so any number of reapers (and workers, which
sweep their own queues too) can run at once without double-handling a job. Schedules are
exactly-once per tick with any number of reapers too (see ``schedules.py``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import signals
from ..backend import get_storage
from ..conf import jobq_settings, journal_in_settings
from ..queue.flows import resolve_parked
from ..queue.sharding import served_queues
from ..storage.base import ReapReport, Storage
from ..tasks.registry import registry
from ..validation import logical_name
from .execution import ledger_alias, prune_outcomes
from .lifecycle import apply_configured_retention

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
        schedules: bool = True,
        reconcile: bool | None = None,
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
            from ..mirror.core import Mirror

            self.mirror = Mirror(self.storage, queues=self.fixed_queues)
        self.retention_days = conf["RETENTION_DAYS"] if retention_days == -1 else retention_days
        self.retention_interval = 60.0
        self._last_purge = 0.0
        self.schedules = schedules
        self._schedule_error: tuple[str, float] | None = None
        self.last_fired: list[str] = []  # ids the last sweep's schedules stored
        # JOBQ["SCHEDULES"] -> Schedule rows (schedule_sync.py): on start, then this often.
        self.schedule_sync_interval: float | None = conf["REAPER"]["schedule_sync_interval"]
        self._last_sync: float | None = None
        self._sync_error: tuple[str, float] | None = None
        # Journal reconcile (journal.py): by default where the settings put a queue in journal
        # mode, so a reaper of a project without the journal never touches its table.
        want_reconcile = journal_in_settings() if reconcile is None else reconcile
        interval_s = conf["JOURNAL"]["RECONCILE_INTERVAL"]
        self.reconcile_interval: float | None = (
            interval_s if want_reconcile and self.storage.supports_journal else None
        )
        self._last_reconcile = 0.0
        self._reconcile_error: tuple[str, float] | None = None
        # The mirror's reconciliation check (mirror_check.py): rows against Redis.
        self.mirror_check_interval: float | None = conf["MIRROR"]["CHECK_INTERVAL"]
        self._last_mirror_check = time.monotonic()
        self._mirror_check_error: tuple[str, float] | None = None

    def queues(self) -> list[str]:
        """Explicit queues, else every queue that was enqueued to, has a handler or settings.
        A sharded queue named explicitly is its partitions (those of an earlier shard count
        too, while registered): its stalled jobs and due retries live there, not under its
        name (``runreaper orders`` swept an empty plain queue before)."""
        if self.fixed_queues:
            physical = [n for n in self.fixed_queues if logical_name(n) != n]
            logical = [n for n in self.fixed_queues if logical_name(n) == n]
            return [*served_queues(logical, self.storage.list_queues()), *physical]
        known = set(self.storage.list_queues()) | set(registry.queues())
        known |= set(jobq_settings()["QUEUES"])
        return sorted(known)

    def run_once(self) -> dict[str, ReapReport]:
        # Schedules first: their errors are contained, so a queue whose sweep fails (and
        # raises out of here) cannot hold back every periodic job as well.
        if self.schedules:
            self.last_fired = self.fire_schedules()
        reports = {}
        for name in self.queues():
            # Flow parents whose children all finished (a crashed worker's missed trigger).
            released = resolve_parked(self.storage, name)
            if released:
                logger.info("%s: released %d flow parents", name, released)
            report = self.storage.reap(name, self.batch)
            # A full batch means more may be waiting: sweep again before sleeping.
            while (
                len(report.requeued) + len(report.failed) + report.promoted >= self.batch
                or report.removed >= self.batch
            ):
                more = self.storage.reap(name, self.batch)
                report.requeued += more.requeued
                report.failed += more.failed
                report.promoted += more.promoted
                report.removed += more.removed
                if (
                    len(more.requeued) + len(more.failed) + more.promoted < self.batch
                    and more.removed < self.batch
                ):
                    break
            for job_id in report.requeued:
                logger.warning("[%s/%s] lease expired: requeued (stalled)", name, job_id)
            for job_id in report.failed:
                logger.error("[%s/%s] lease expired past max_stalls: failed", name, job_id)
            if signals.job_stalled.receivers:
                signals.stalled(Reaper, name, report.requeued, report.failed, None)
            if report.promoted:
                logger.debug("%s: promoted %d due jobs", name, report.promoted)
            if report.removed:
                logger.debug("%s: retention removed %d finished jobs", name, report.removed)
            reports[name] = report
        if not self.storage.supports_transactional_enqueue and registry.atomic_queues():
            # Redis: the outcome ledger of atomic handlers ends with its jobs' result TTL.
            alias = ledger_alias(True)
            while prune_outcomes(alias, self.batch) >= self.batch:
                pass
        return reports

    def database_alias(self) -> str:
        """The Django database the reaper purges and reads schedules from: the database
        backend's own, else the mirror's."""
        return getattr(self.storage, "using", None) or jobq_settings()["MIRROR"]["DATABASE_ALIAS"]

    def fire_schedules(self) -> list[str]:
        """Enqueue the due ticks of periodic schedules. A failure here (a database that is down
        or not migrated) is logged and never stops stall recovery."""
        from django.db import connections

        from ..schedules.core import GRACE, fire_due

        alias = self.database_alias()
        # A sweep that took a few intervals must not turn due ticks into "missed" ones.
        grace = max(GRACE, dt.timedelta(seconds=2 * self.interval))
        try:
            fired = fire_due(storage=self.storage, using=alias, grace=grace)
        except Exception as exc:
            self._schedule_error = _warn_rarely("schedules not fired", exc, self._schedule_error)
            # A broken connection of this long-lived thread is not replaced by Django's
            # request cycle: drop it so the next sweep reconnects.
            connections[alias].close_if_unusable_or_obsolete()
            return []
        self._schedule_error = None
        return fired

    def sync_schedules(self) -> Any:
        """Sync ``JOBQ["SCHEDULES"]`` to Schedule rows. Invalid settings, or a database that is
        down or not migrated, are logged (once a minute at most) and never stop the sweep:
        the rows as they were keep firing."""
        from django.db import connections

        from ..schedules.sync import sync

        self._last_sync = time.monotonic()
        alias = self.database_alias()
        try:
            report = sync(using=alias)
        except Exception as exc:
            self._sync_error = _warn_rarely("schedules not synced", exc, self._sync_error)
            connections[alias].close_if_unusable_or_obsolete()
            return None
        self._sync_error = None
        return report

    def _sync_due(self) -> bool:
        if not self.schedules:
            return False
        if self._last_sync is None:
            return True
        every = self.schedule_sync_interval
        return every is not None and time.monotonic() - self._last_sync >= every

    def reconcile(self) -> None:
        """Re-create jobs Redis lost from the journal. Errors (database down, table not
        migrated) are logged at most once a minute and never stop stall recovery."""
        from django.db import connections

        from ..queue.journal import journal_alias, reconcile

        self._last_reconcile = time.monotonic()
        try:
            reports = reconcile(self.storage, self.fixed_queues)
        except Exception as exc:
            self._reconcile_error = _warn_rarely(
                "journal not reconciled", exc, self._reconcile_error
            )
            connections[journal_alias()].close_if_unusable_or_obsolete()
            return
        self._reconcile_error = None
        for name, report in reports.items():
            if report.recreated or report.dropped:
                logger.warning("journal %s: %s", name, report)

    def check_mirror(self) -> None:
        """Compare the mirror's rows with Redis and repair what differs. Errors are logged at
        most once a minute and never stop stall recovery."""
        from ..mirror.check import check

        self._last_mirror_check = time.monotonic()
        try:
            check(self.mirror, self.queues())
        except Exception as exc:
            self._mirror_check_error = _warn_rarely(
                "mirror not checked", exc, self._mirror_check_error
            )
            return
        self._mirror_check_error = None

    def purge(self) -> int:
        """Delete job rows past the retention period (mirror rows, or database-backend state
        whose deduplication window has closed)."""
        from ..mirror.core import purge_finished

        self._last_purge = time.monotonic()
        if self.retention_days is None:
            return 0
        n = purge_finished(self.retention_days, using=self.database_alias())
        if n:
            logger.info(
                "retention: deleted %d finished jobs older than %s days", n, self.retention_days
            )
        return n

    def run(self) -> None:
        logger.info("reaper sweeping every %.2fs", self.interval)
        # The database backend applies retention only in sweeps: the reaper writes the
        # settings' policy too, so a deployment whose workers have not restarted follows it.
        try:
            apply_configured_retention(self.storage, self.queues())
        except Exception as exc:  # storage down at start: workers apply it too, and it holds
            logger.warning("retention from settings not applied: %s", exc)
        mirror_thread = self.mirror.start() if self.mirror is not None else None
        try:
            while not self._stop.is_set():
                try:
                    if self._sync_due():  # before firing: a new schedule's row must exist
                        self.sync_schedules()
                    self.run_once()
                    if mirror_thread is not None and not mirror_thread.is_alive():
                        # Never expected (its loop catches every error), but a mirror that
                        # died would leave the admin behind for good: say so and start anew.
                        logger.error("the mirror thread stopped; starting it again")
                        mirror_thread = self.mirror.start()
                    if time.monotonic() - self._last_purge >= self.retention_interval:
                        self.purge()
                    if (
                        self.reconcile_interval is not None
                        and time.monotonic() - self._last_reconcile >= self.reconcile_interval
                    ):
                        self.reconcile()
                    if (
                        self.mirror is not None
                        and self.mirror_check_interval
                        and time.monotonic() - self._last_mirror_check >= self.mirror_check_interval
                    ):
                        self.check_mirror()
                except Exception as exc:  # storage down: keep trying, never exit on a blip
                    logger.warning("reaper sweep failed: %s", exc)
                self._stop.wait(self.interval)
        finally:
            if mirror_thread is not None:
                self.mirror.stop()
                mirror_thread.join(timeout=10)

    def stop(self) -> None:
        self._stop.set()


def _warn_rarely(
    what: str, exc: Exception, last: tuple[str, float] | None
) -> tuple[str, float] | None:
    """Log a recurring error once a minute at most (or when it changes): a reaper without
    the schedule or journal table would otherwise log every sweep. Returns the new memo."""
    message = f"{type(exc).__name__}: {exc}"
    if last is None or last[0] != message or time.monotonic() - last[1] >= 60:
        logger.warning("%s: %s", what, message)
        return (message, time.monotonic())
    return last
