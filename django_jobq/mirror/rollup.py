"""Fold finished jobs into per-minute rows (``JobMinute``) for the admin's charts and counts.

Why: the queue page's charts grouped the jobs table by minute and hour on every view, which
took seconds on a million rows. Here each view first folds only the jobs finished since the
previous fold (the ``finished_at`` index finds them), then reads at most 1,440 small rows per
queue and day. Folding is idempotent: a minute is recomputed from the job rows, so folding
twice cannot count a job twice, and folds take a lock (two admins do not fold at once). The
one exception: a backlog fold whose budget ends inside a minute leaves the mark there, and the
next fold adds the rest of that minute to its row (rows before such a mark finished long
before the fold: final).

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
from django.db.models import Case, Count, DurationField, ExpressionWrapper, F, Q, Sum, When

from ..states import JobState
from ..validation import logical_name

STEP = dt.timedelta(minutes=1)
#: Minutes folded again at every fold: finishes whose rows were committed after the fold.
REOPEN = dt.timedelta(minutes=1)
#: How far back a first fold goes, and how long minute rows are kept.
KEEP = dt.timedelta(hours=25)
#: Backlog rows (older than ``REOPEN``) read per fold at most (about 60 ms on PostgreSQL
#: here): one page view never pays for a day of backlog or a burst, the next views continue
#: where it stopped, even inside a minute (the pages say how far the fold has got; their
#: last-hour counts stay exact meanwhile: ``finished_since``).
BUDGET = 5_000
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
    wait_ms: float = 0.0
    run_ms: float = 0.0


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


def fold(alias: str, now: dt.datetime, budget: int | None = None) -> FoldResult:
    """Fold the jobs finished since the mark (less ``REOPEN``) into minute rows.

    Another fold running at the same moment (a second admin, the database locked by a
    writer) is not waited for: this view then shows the minute rows as they are."""
    from ..models import Job, JobMinute

    RollupMark = _mark_model()
    budget = BUDGET if budget is None else budget
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
            # A mark inside a minute: the previous fold's budget ran out there, in the
            # backlog (long before that fold's REOPEN window), so the rows before it are
            # final and counted in that minute's row; this fold adds the rest of the minute.
            partial = resume != floor_minute(resume)
            # Otherwise read from REOPEN before the mark: a job that finished just before the
            # previous fold but was committed after it (its transaction still open) counts
            # now. The backlog budget still advances from the mark (``resume``).
            start = resume if partial else max(oldest, resume - REOPEN)
            since_start = (
                Job.objects.using(alias)
                .filter(finished_at__gte=start, state__in=FINISHED)
                .order_by("finished_at")
                .values_list("queue", "state", "created_at", "run_at", "started_at",
                             "finished_at")
            )  # fmt: skip
            end, behind = current + STEP, False
            if resume < tail:  # a backlog: fold at most ``budget`` rows of it
                probe = list(
                    since_start.filter(finished_at__gte=resume, finished_at__lt=tail)
                    .values_list("finished_at", flat=True)[budget : budget + 1]
                )  # fmt: skip
                if probe and probe[0] is not None:  # not None: filtered on finished_at
                    behind = True
                    # Up to that row, even inside a minute (a burst of 150,000 jobs in one
                    # minute cost one view seconds when minutes were folded whole); rows
                    # sharing one instant beyond the budget are folded together.
                    end = max(probe[0], resume + dt.timedelta(microseconds=1))
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
                    slot.wait_ms += wait
                    slot.run_ms += run
            minute_rows = JobMinute.objects.using(alias)
            minute_rows.filter(minute__gte=start, minute__lt=end).delete()
            minute_rows.filter(minute__lt=oldest).delete()
            if partial:
                _add_to(minute_rows, floor_minute(start), minutes)
            minute_rows.bulk_create(
                JobMinute(queue=q, minute=m, completed=s.completed, failed=s.failed,
                          waits=s.waits, runs=s.runs, wait_ms_total=s.wait_ms,
                          run_ms_total=s.run_ms)
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


def _add_to(minute_rows, minute: dt.datetime, minutes: dict) -> None:
    """Add the slots of ``minute`` (the rest of a minute a budget cut) to its existing rows,
    taking them out of ``minutes``; a queue with no row there yet keeps its slot, created."""
    names = [queue for queue, at in minutes if at == minute]
    for existing in minute_rows.filter(minute=minute, queue__in=names):
        slot = minutes.pop((existing.queue, minute))
        existing.completed += slot.completed
        existing.failed += slot.failed
        for histogram, added in ((existing.waits, slot.waits), (existing.runs, slot.runs)):
            for bucket, n in added.items():
                histogram[str(bucket)] = histogram.get(str(bucket), 0) + n
        existing.wait_ms_total += slot.wait_ms
        existing.run_ms_total += slot.run_ms
        existing.save(
            update_fields=["completed", "failed", "waits", "runs", "wait_ms_total", "run_ms_total"]
        )


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


@dataclass
class Finished:
    """One queue's finished jobs over a window: counts, and the wait/run sums of those that
    started (``timed``), for exact means."""

    completed: int = 0
    failed: int = 0
    timed: int = 0
    wait_ms: float = 0.0
    run_ms: float = 0.0

    @property
    def ended(self) -> int:
        return self.completed + self.failed

    def mean_wait_ms(self) -> float | None:
        return self.wait_ms / self.timed if self.timed else None

    def mean_run_ms(self) -> float | None:
        return self.run_ms / self.timed if self.timed else None


def finished_since(
    alias: str, since: dt.datetime, until: dt.datetime | None = None
) -> dict[str, Finished]:
    """{queue: Finished} of the jobs finished in the minutes from ``since`` on, all queues.

    The folded minutes (before ``until``, the fold's mark when not given) come from the
    minute rows; the minutes the fold has not reached yet from the job rows themselves, in
    one grouped query along the finished_at index. Why both: while the fold catches up after
    a burst, the minute rows alone undercount (the overview once said 22,858 of 150,000
    jobs), and the job rows alone cost a pass over every job of the hour on every poll."""
    from ..models import Job, JobMinute

    since = floor_minute(since)
    # The fold's last REOPEN minutes before its mark are not final (rows committed late),
    # nor is the minute of a mark inside a minute (a budget cut): whole minutes before.
    until = max(since, floor_minute((until or mark(alias) or since) - REOPEN))
    out: dict[str, Finished] = defaultdict(Finished)
    rows = (
        JobMinute.objects.using(alias)
        .filter(minute__gte=since, minute__lt=until)
        .values("queue")
        .annotate(
            completed=Sum("completed"),
            failed=Sum("failed"),
            wait_ms=Sum("wait_ms_total"),
            run_ms=Sum("run_ms_total"),
        )  # fmt: skip
        .order_by()
    )
    for row in rows:
        slot = out[row["queue"]]
        slot.completed += int(row["completed"] or 0)
        slot.failed += int(row["failed"] or 0)
        slot.wait_ms += float(row["wait_ms"] or 0)
        slot.run_ms += float(row["run_ms"] or 0)
    minute_rows = JobMinute.objects.using(alias).filter(minute__gte=since, minute__lt=until)
    for queue, waits in minute_rows.values_list("queue", "waits").iterator():
        out[queue].timed += sum(int(n) for n in (waits or {}).values())
    started = Q(started_at__isnull=False)
    due = Case(
        When(run_at__gt=F("created_at"), then=F("run_at")),
        default=F("created_at"),
    )
    tail = (
        Job.objects.using(alias)
        .filter(finished_at__gte=until, state__in=FINISHED)
        .values("queue", "state")
        .annotate(
            n=Count("id"),
            timed=Count("id", filter=started),
            wait=Sum(ExpressionWrapper(F("started_at") - due, DurationField()), filter=started),
            run=Sum(
                ExpressionWrapper(F("finished_at") - F("started_at"), DurationField()),
                filter=started,
            ),
        )
        .order_by()
    )
    for tail_row in tail:
        slot = out[logical_name(tail_row["queue"])]
        if tail_row["state"] == JobState.COMPLETED.value:
            slot.completed += tail_row["n"]
        else:
            slot.failed += tail_row["n"]
        slot.timed += tail_row["timed"]
        slot.wait_ms += _ms(tail_row["wait"])
        slot.run_ms += _ms(tail_row["run"])
    return dict(out)


def _ms(value: dt.timedelta | None) -> float:
    return 0.0 if value is None else max(0.0, value.total_seconds() * 1000)


def minutes(alias: str, queue: str, since: dt.datetime) -> list:
    """The minute rows of ``queue`` from ``since`` on, oldest first."""
    from ..models import JobMinute

    return list(
        JobMinute.objects.using(alias)
        .filter(queue=queue, minute__gte=floor_minute(since))
        .order_by("minute")
    )
