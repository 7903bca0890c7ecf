"""Fold finished jobs into per-minute rows (``JobMinute``) for the admin's charts and counts.

Why: the queue page's charts grouped the jobs table by minute and hour on every view, which
took seconds on a million rows. Here each view first folds only the jobs finished since the
previous fold (the ``finished_at`` index finds them), then reads at most 1,440 small rows per
queue and day. Folding is idempotent: a minute is recomputed from the job rows, never added
to, so folding twice, or two admins folding at once, cannot count a job twice.

Rows can arrive late: a worker's transaction commits after its ``finished_at``; the Redis
mirror writes jobs seconds (or, after an outage, hours) after they finished. So the last
``REOPEN`` minutes are folded again each time, and the mirror calls ``reopen()`` in its own
batch transaction when it writes a job that finished before the mark, which moves the mark
back so those minutes are recomputed at the next fold.

Wait and run times are kept as sparse log histograms (8 buckets per doubling, so a
percentile read from them is within 9% of the exact one) that merge by adding counts.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import Sum

from ..states import JobState
from ..validation import logical_name

STEP = dt.timedelta(minutes=1)
#: Minutes folded again at every fold: finishes whose rows were committed after the fold.
REOPEN = dt.timedelta(minutes=1)
#: How far back a first fold goes, and how long minute rows are kept.
KEEP = dt.timedelta(hours=25)
#: Backlog rows (older than ``REOPEN``) read per fold at most, plus the rest of the minute
#: where the budget ends: one page view never pays for a day of backlog, the next views
#: continue where it stopped (the queue page says how far the fold has got).
BUDGET = 20_000
PER_DOUBLING = 8
FINISHED = (JobState.COMPLETED.value, JobState.FAILED.value)


def floor_minute(when: dt.datetime) -> dt.datetime:
    return when.astimezone(dt.UTC).replace(second=0, microsecond=0)


def bucket_of(ms: float) -> int:
    """The histogram bucket of a duration in ms: -1 below 1 ms, else floor(8·log2(ms))."""
    return -1 if ms < 1 else int(math.floor(math.log2(ms) * PER_DOUBLING))


def bucket_value(bucket: int) -> float:
    """A bucket's representative duration in ms (its geometric middle)."""
    return 0.5 if bucket < 0 else 2 ** ((bucket + 0.5) / PER_DOUBLING)


def merge(into: dict[int, int], histogram: Mapping[str | int, int]) -> None:
    for key, count in histogram.items():
        into[int(key)] = into.get(int(key), 0) + int(count)


def quantile(histogram: Mapping[int, int], q: float) -> float | None:
    """Nearest-rank quantile of a histogram, in ms; None when it is empty."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_value(bucket)
    return bucket_value(max(histogram))  # pragma: no cover - rank <= total


@dataclass
class _Minute:
    completed: int = 0
    failed: int = 0
    waits: dict[int, int] = field(default_factory=dict)
    runs: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FoldResult:
    """Minutes before ``until`` are folded; ``behind`` when a backlog is left for later."""

    until: dt.datetime
    behind: bool
    rows: int


def _mark_model():
    from ..models import RollupMark

    return RollupMark


def mark(alias: str) -> dt.datetime | None:
    row = _mark_model().objects.using(alias).order_by("pk").first()
    return None if row is None else row.until


def fold(alias: str, now: dt.datetime, budget: int = BUDGET) -> FoldResult:
    """Fold the jobs finished since the mark (less ``REOPEN``) into minute rows.

    Another fold running at the same moment (a second admin, the database locked by a
    writer) is not waited for: this view then shows the minute rows as they are."""
    from ..models import Job, JobMinute

    RollupMark = _mark_model()
    current = floor_minute(now)
    oldest = floor_minute(now - KEEP)
    try:
        with transaction.atomic(using=alias):
            _write_lock(alias)
            row = (
                RollupMark.objects.using(alias).select_for_update(nowait=_nowait(alias))
                .order_by("pk").first()
            )  # fmt: skip
            tail = current - REOPEN
            resume = max(oldest, min(row.until if row else oldest, tail))
            # Read from REOPEN before the mark: a job that finished just before the previous
            # fold but was committed after it (its transaction still open then) counts now.
            # The backlog budget still advances from the mark (``resume``), so folds progress.
            start = max(oldest, resume - REOPEN)
            since_start = (
                Job.objects.using(alias)
                .filter(finished_at__gte=start, state__in=FINISHED)
                .order_by("finished_at")
                .values_list("queue", "state", "created_at", "run_at", "started_at",
                             "finished_at")
            )  # fmt: skip
            end, behind = current + STEP, False
            if resume < tail:  # a backlog: fold at most ``budget`` rows of it, whole minutes
                probe = list(
                    since_start.filter(finished_at__gte=resume, finished_at__lt=tail)
                    .values_list("finished_at", flat=True)[budget : budget + 1]
                )  # fmt: skip
                if probe and probe[0] is not None:  # not None: filtered on finished_at
                    behind = True
                    end = max(floor_minute(probe[0]), resume + STEP)
            found = list(since_start.filter(finished_at__lt=end))
            minutes: dict[tuple[str, dt.datetime], _Minute] = defaultdict(_Minute)
            for queue, state, created, run_at, started, finished in found:
                if finished is None:  # pragma: no cover - filtered on finished_at
                    continue
                # A sharded queue's partitions fold into its logical name: charts and
                # counts read one row per queue and minute, whatever the shard count.
                slot = minutes[(logical_name(queue), floor_minute(finished))]
                if state == JobState.COMPLETED.value:
                    slot.completed += 1
                else:
                    slot.failed += 1
                if started is not None:
                    due = run_at if run_at and run_at > created else created
                    wait = max(0.0, (started - due).total_seconds() * 1000)
                    run = max(0.0, (finished - started).total_seconds() * 1000)
                    slot.waits[bucket_of(wait)] = slot.waits.get(bucket_of(wait), 0) + 1
                    slot.runs[bucket_of(run)] = slot.runs.get(bucket_of(run), 0) + 1
            minute_rows = JobMinute.objects.using(alias)
            minute_rows.filter(minute__gte=start, minute__lt=end).delete()
            minute_rows.filter(minute__lt=oldest).delete()
            minute_rows.bulk_create(
                JobMinute(queue=q, minute=m, completed=s.completed, failed=s.failed,
                          waits=s.waits, runs=s.runs)
                for (q, m), s in minutes.items()
            )  # fmt: skip
            until = min(end, current)  # the current minute is never final
            if row is None:
                RollupMark.objects.using(alias).create(until=until)
            else:
                RollupMark.objects.using(alias).filter(pk=row.pk).update(until=until)
    except (OperationalError, IntegrityError):  # a concurrent fold holds the lock
        return FoldResult(mark(alias) or oldest, True, 0)
    return FoldResult(until, behind, len(found))


def reopen(alias: str, finished: Iterable[dt.datetime | int | None]) -> None:
    """Move the mark back to the earliest of ``finished`` (datetimes, or ms since the epoch
    as in job records) so that the next fold recomputes those minutes. Called by the mirror
    inside its batch transaction, so a written row and its reopening commit together."""
    times = [
        dt.datetime.fromtimestamp(t / 1000, tz=dt.UTC) if isinstance(t, int) else t
        for t in finished
        if t is not None
    ]
    if not times:
        return
    _mark_model().objects.using(alias).filter(until__gt=floor_minute(min(times))).update(
        until=floor_minute(min(times))
    )


def _write_lock(alias: str) -> None:
    """SQLite: take the write lock first (see mirror_sql.take_write_lock); it fails after the
    busy timeout rather than reading and then failing on the write."""
    from ..models import JobMinute
    from .sql import take_write_lock

    take_write_lock(JobMinute, alias)


def _nowait(alias: str) -> bool:
    return bool(connections[alias].features.has_select_for_update_nowait)


# -- reading ------------------------------------------------------------------------------


def finished_counts(alias: str, since: dt.datetime) -> dict[str, dict[str, int]]:
    """{queue: {state: n}} of jobs finished in the minutes from ``since`` on (all queues)."""
    from ..models import JobMinute

    out: dict[str, dict[str, int]] = {}
    rows = (
        JobMinute.objects.using(alias)
        .filter(minute__gte=floor_minute(since))
        .values("queue")
        .annotate(completed=Sum("completed"), failed=Sum("failed"))
        .order_by()
    )
    for row in rows:
        out[row["queue"]] = {
            JobState.COMPLETED.value: int(row["completed"] or 0),
            JobState.FAILED.value: int(row["failed"] or 0),
        }
    return out


def minutes(alias: str, queue: str, since: dt.datetime) -> list:
    """The minute rows of ``queue`` from ``since`` on, oldest first."""
    from ..models import JobMinute

    return list(
        JobMinute.objects.using(alias)
        .filter(queue=queue, minute__gte=floor_minute(since))
        .order_by("minute")
    )
