"""How far the model mirror is from Redis: its lag (for health and the admin banner) and the
reconciliation check (``manage.py jobq_mirror_check``, and the reaper on an interval).

The lag is measured on the consumer group, not on the rows: the oldest entry the group has
not acknowledged (delivered and pending, or not delivered yet) and how many there are. So it
is 0 only when there is nothing left to write, and a mirror that is down, wedged or slow
shows a growing age instead of the last value it managed to report.

The check compares what the rows say with what Redis says, per queue: the counts of the
waiting and running states (Redis keeps them in sets, the rows in an index), and a sample
of records (the head of each live set and of the newest rows). A difference is repaired the
way a gap is: the queue is re-read from its records.

A queue the mirror shows as counts and a sample (``mirror_sample``: it fell behind on a big
queue) is checked as such: its rows are not expected to add up to Redis's counts, so only the
sample is compared (the same newest-per-state records the mode writes), and a difference
there is repaired with a new sample.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from typing import Any

from django.db.models import Count

from ..conf import jobq_settings
from ..states import JobState

logger = logging.getLogger("django_jobq.mirror")

#: States whose Redis counts are live sets (completed/failed are lifetime counters there).
LIVE_STATES = (JobState.QUEUED, JobState.ACTIVE, JobState.SCHEDULED, JobState.RETRYING)


def lag(storage: Any, queues: Sequence[str]) -> tuple[float | None, int | None]:
    """(age in seconds of the oldest event not written yet, events not written yet) over
    ``queues``; (None, None) without a mirror (database backend, or the mirror disabled)."""
    if not hasattr(storage, "group_backlog") or not jobq_settings()["MIRROR"]["ENABLED"]:
        return None, None
    import time

    from .core import GROUP

    now, age, backlog = time.time() * 1000, 0.0, 0
    for name in queues:
        events, oldest = storage.group_backlog(name, GROUP)
        backlog += events
        if oldest is not None:
            age = max(age, (now - oldest) / 1000)
    if backlog:  # 0 means "nothing behind", never "behind by less than a millisecond"
        age = max(age, 0.001)
    return round(age, 3), backlog


#: How long health and the admin keep reporting a gap the mirror resynced.
GAP_REPORT_SECONDS = 3600.0


def recent_gaps(
    storage: Any, queues: Sequence[str] | None = None, within: float = GAP_REPORT_SECONDS
) -> list[dict[str, Any]]:
    """The gaps the mirror resynced in the last ``within`` seconds, newest first: one per
    queue (its latest), each ``{"queue", "at", "why", "rows", "seconds", "consumer"}``.

    A gap means the stream lost events before the mirror wrote them (the ``EVENTS_MAXLEN``
    safety cap, a flush, a Redis restart): the queue was re-read from its records, so its
    rows are current again, but a job that finished *and* expired inside the gap keeps its
    last mirrored state. That is why it is reported rather than only logged."""
    if not hasattr(storage, "mirror_gaps") or not jobq_settings()["MIRROR"]["ENABLED"]:
        return []
    import time

    since = time.time() - within
    gaps = [
        {"queue": queue, **gap}
        for queue, gap in storage.mirror_gaps().items()
        if (queues is None or queue in queues) and _number(gap.get("at")) >= since
    ]
    return sorted(gaps, key=lambda g: -_number(g["at"]))


def lost_rows(alias: str, queues: Sequence[str]) -> int:
    """Accepted jobs of ``queues`` that Redis lost before they finished: the rows the mirror
    marked ``lost`` (``Mirror.mark_lost``), kept until retention purges them."""
    from ..models import Job

    return Job.objects.using(alias).filter(state="lost", queue__in=list(queues)).count()


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


@dataclasses.dataclass
class QueueCheck:
    """What the check found on one queue."""

    queue: str
    redis_counts: dict[str, int]
    row_counts: dict[str, int]
    sampled: int = 0
    mismatched: list[str] = dataclasses.field(default_factory=list)  # sampled ids that differ
    repaired: int = 0  # rows rewritten (0 when consistent, or with repair=False)
    behind: int = 0  # events the mirror had not written yet (a difference is then expected)
    mode: str = "exact"  # "sampled": the rows are counts and a sample (counts not compared)

    @property
    def consistent(self) -> bool:
        counts_agree = self.mode == "sampled" or self.redis_counts == self.row_counts
        return counts_agree and not self.mismatched

    def __str__(self) -> str:
        if self.consistent and self.mode == "sampled":
            return (f"{self.queue}: shown as counts and a sample; the sample is consistent "
                    f"({self.sampled} records)")  # fmt: skip
        if self.consistent:
            return f"{self.queue}: consistent ({self.sampled} records sampled)"
        rows = self.row_counts
        diff = {s: (n, rows.get(s, 0)) for s, n in self.redis_counts.items() if n != rows.get(s)}
        text = f"{self.queue}: counts (redis, rows) differ {diff}" if diff else self.queue + ":"
        if self.mismatched:
            text += f" {len(self.mismatched)} of {self.sampled} sampled records differ"
        if self.behind:
            text += f"; the mirror is {self.behind} events behind (not repaired)"
        return text + (f"; repaired {self.repaired} rows" if self.repaired else "")


def check_queue(mirror: Any, queue: str, *, sample: int = 200, repair: bool = True) -> QueueCheck:
    """Compare ``queue``'s rows with Redis, and re-read the queue when they differ.

    Jobs keep moving while the check reads, and rows trail Redis by the mirror's backlog, so
    a difference is only repaired when the mirror has nothing left to write and a second
    look finds it still there: a busy queue is not re-read for a race."""
    from .core import GROUP

    report = _compare(mirror, queue, sample)
    report.behind = mirror.storage.group_backlog(queue, GROUP)[0]
    if not report.consistent and not report.behind:
        report = _compare(mirror, queue, sample)
        report.behind = 0
        if not report.consistent and repair:
            report.repaired = mirror.heal(queue, "the check found rows that differ from Redis")
    return report


def _compare(mirror: Any, queue: str, sample: int) -> QueueCheck:
    storage, rows = mirror.storage, mirror.Job.objects.using(mirror.using).filter(queue=queue)
    live = storage.counts(queue)
    redis_counts = {s.value: int(live.get(s, 0)) for s in LIVE_STATES}
    grouped = rows.filter(state__in=[s.value for s in LIVE_STATES]).values("state")
    row_counts = {s.value: 0 for s in LIVE_STATES}
    row_counts.update({r["state"]: r["n"] for r in grouped.annotate(n=Count("id")).order_by()})
    report = QueueCheck(queue, redis_counts, row_counts)
    if queue in sampled_modes(mirror):
        report.mode = "sampled"  # what the mode wrote: the newest records of each state
        ids = storage.sample_ids(queue, mirror.sample_size)
    else:
        ids = _sample_ids(storage, rows, queue, sample)
    records = storage.get_records(queue, ids)
    mirrored = dict(rows.filter(job_id__in=ids).values_list("job_id", "state"))
    report.sampled = len(ids)
    for job_id, record in records.items():
        if record is not None and mirrored.get(job_id) != record.state.value:
            report.mismatched.append(job_id)
    return report


def sampled_modes(mirror: Any) -> dict[str, dict[str, Any]]:
    """The queues shown as counts and a sample, as Redis says now (another mirror process
    may have switched one since this mirror last looked)."""
    mirror.sampled = mirror.storage.mirror_sampled()
    return mirror.sampled


def sampled_queues(storage: Any, queues: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The queues the mirror shows as counts and a sample, oldest switch first: each
    ``{"queue", "since", "why", "counts"}``, the counts per state read from Redis now (the
    rows of such a queue hold only a sample, so these are the figures to trust)."""
    if not hasattr(storage, "mirror_sampled") or not jobq_settings()["MIRROR"]["ENABLED"]:
        return []
    out = []
    for queue, mode in storage.mirror_sampled().items():
        if queues is None or queue in queues:
            counts = {state.value: int(n) for state, n in storage.counts(queue).items()}
            out.append({"queue": queue, "since": _number(mode.get("since")),
                        "why": str(mode.get("why", "")), "counts": counts})  # fmt: skip
    return sorted(out, key=lambda m: m["since"])


def _sample_ids(storage: Any, rows: Any, queue: str, size: int) -> list[str]:
    """Ids worth comparing: the head of the queued and active sets in Redis, and a random
    pick of the rows the models call unfinished (the rows most likely to be stale)."""
    ids = storage.head_ids(queue, size // 4)
    unfinished = list(
        rows.filter(state__in=[s.value for s in LIVE_STATES])
        .order_by("-id")
        .values_list("job_id", flat=True)[: size * 5]
    )
    ids += random.sample(unfinished, min(len(unfinished), size // 2))  # noqa: S311 - a sample
    return list(dict.fromkeys(ids))[:size]


def check(mirror: Any, queues: Sequence[str] | None = None, **options: Any) -> list[QueueCheck]:
    """``check_queue`` for every queue the mirror follows (or ``queues``)."""
    reports = [check_queue(mirror, q, **options) for q in (queues or mirror.queues())]
    for report in reports:
        (logger.info if report.consistent else logger.warning)("mirror check %s", report)
    return reports
