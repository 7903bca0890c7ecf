"""Retention of finished jobs on the database backend (``Retention``, docs/settings.md).

Here the rows are the state, so a finished job is removed by deleting its row (its events and
a dedup key it held go with it). Finishing a job does not trim: the hot path stays
one statement on PostgreSQL. The reaper pass does (``reap``, which workers run on their own
queues every ``reap_interval`` too): per state with a policy, at most ``limit`` rows past the
count (newest first by ``finished_at``, then primary key) and at most ``limit`` rows finished
before ``now - age``, each a bounded ``DELETE`` over the ``(queue, state, finished_at)``
index. Between passes a queue may hold a pass's worth of finished rows more than its count.
The count is of job records, as ``get_record`` shows them (``_records``): a row whose
``result_ttl`` passed, or a run a singleton successor replaced (``<id>~<pk>``), is no record
of the state, so it neither counts toward n nor makes a record within the newest n go.
"""

from __future__ import annotations

from ...job import Keep, Retention
from ...states import JobState
from ..base import ReapReport
from .core import _chunks, _dt
from .operations import Operations

_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


def retention_from_json(raw: dict | None) -> Retention:
    """The ``QueueConfig.retention`` column as a ``Retention`` (None or {}: no policy)."""
    raw = raw or {}
    return Retention(**{
        state: Keep(keep.get("count"), keep.get("age"))
        for state, keep in raw.items() if state in ("completed", "failed", "cancelled")
    })  # fmt: skip


class Retaining(Operations):
    def set_retention(self, queue: str, retention: Retention | None) -> None:
        value = {
            state: {"count": keep.count, "age": keep.age}
            for state, keep in (retention or Retention()).items()
            if keep is not None
        }
        with self._atomic():
            self._write_lock()
            self._configs().get_or_create(name=queue)
            self._configs().filter(name=queue).update(retention=value or None)

    def get_retention(self, queue: str) -> Retention:
        row = self._configs().filter(name=queue).values_list("retention", flat=True).first()
        return retention_from_json(row)

    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        report = super().reap(queue, limit)
        report.removed = self.retain(queue, limit)
        self.fold_counts(queue)
        return report

    def retain(self, queue: str, limit: int = 1000) -> int:
        """Delete the finished rows past the queue's policy: at most ``limit`` per state and
        bound in one call. Returns how many rows went."""
        retention = self.get_retention(queue)
        if retention.empty:
            return 0
        now = self._now()
        removed = 0
        for state in _STATES:
            keep = getattr(retention, state.value)
            if keep is None:
                continue
            rows = self._jobs().filter(queue=queue, state=state, finished_at__isnull=False)
            doomed: list[int] = []
            if keep.count is not None:
                # The newest n *records*: a row get_record would not show (expired by its
                # result_ttl, or a run its singleton successor replaced, under a reserved
                # name) is none, so it neither counts toward n nor goes by the count.
                records = self._records(rows, now).order_by("-finished_at", "-id")
                newest_first = records.values_list("id", flat=True)
                doomed += newest_first[keep.count : keep.count + limit]
            if keep.age is not None:
                old = rows.filter(finished_at__lte=_dt(now - keep.age)).order_by("finished_at")
                doomed += old.values_list("id", flat=True)[:limit]
            if doomed:
                with self._atomic():
                    self._write_lock()
                    removed += self._delete_still_finished(queue, state, sorted(set(doomed)))
        return removed

    def _delete_still_finished(self, queue: str, state: JobState, pks: list[int]) -> int:
        """Delete those of ``pks`` still finished in ``state``, with the dedup keys they held
        and their events (after them, as in ``_delete_rows``); how many went.

        The delete itself checks the state: a row retried since it was picked is not finished
        now and stays, with its events (on PostgreSQL the delete waits for the retry's
        transaction and reads the row again). Django's ``QuerySet.delete`` deleted the rows
        picked by primary key only, so such a row went, and the retry's event was either an
        orphan or, with the event's foreign key of before migration 0023, a failed pass."""
        gone: list[int] = []
        for chunk in _chunks(pks):
            marks = ", ".join(["%s"] * len(chunk))
            gone += [r[0] for r in self._sql(
                f"DELETE FROM {self._table} WHERE id IN ({marks}) AND queue = %s AND state = %s "
                "AND finished_at IS NOT NULL RETURNING id",
                [*chunk, queue, state.value],
            )]  # fmt: skip
        for chunk in _chunks(gone):
            marks = ", ".join(["%s"] * len(chunk))
            dedup = self._quoted(self.DedupKey)
            self._sql(f"DELETE FROM {dedup} WHERE job_id IN ({marks})", chunk, fetch=False)
            self._forget_events(f"job_id IN ({marks})", chunk)
        return len(gone)
