"""Counts and a sample: how the mirror sheds load on a big queue it fell behind on.

A gap (events the stream cap trimmed before the mirror read them) used to be healed by
re-reading every live record of the queue. On a queue of a quarter of a million jobs that
re-read takes minutes, and while it runs the worker keeps adding events the cap trims again:
the next check finds a new gap and starts another full re-read, so a mirror that fell behind
spent the rest of the run re-reading. Here, a gap on a *big* queue (more waiting and running
jobs than ``MIRROR["SAMPLE_ABOVE"]``), or on a queue already in this mode, is healed with:

- the queue's **counts** per state, read from Redis (health and the admin show those, and the
  overview's counts come from Redis anyway);
- a **bounded sample** of records written as rows: the newest and the next jobs of the
  queued line, the active ones, the newest scheduled and dead-lettered, and the jobs the
  newest stream entries name (just finished): ``MIRROR["SAMPLE"]`` per state;
- the group moved past the stream position noted before the sample, as for any heal, so
  the events after it are written one by one as usual.

The mode is recorded in Redis (``{prefix}:mirror:sampled``: since, why, counts), said in
``/jobq/health`` (``mirror_sampled``) and the admin banner, and read by the reconciliation
check, which then compares the sample rather than the counts.

**Back to exact rows** once a full re-read fits: on a gap check the queue has no gap, the
group's backlog is at most one batch (the mirror caught up), and the events the stream is
expected to receive during a full re-read (its rate since the last check × the records to
re-read × the measured seconds per record) fill less than half the cap. A quiet queue (rate
0) always fits, so the last completion of a burst is followed by one exact re-read. If the
cap trimmed unread events during that re-read after all, the queue stays sampled.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..states import TERMINAL_STATES, JobState

logger = logging.getLogger("django_jobq.mirror")

FINAL = frozenset(state.value for state in TERMINAL_STATES)
#: Seconds a full re-read is assumed to take per record until one was measured.
SECONDS_PER_RECORD = 0.0002
#: States whose Redis counts are sets of live records (the rest are lifetime counters).
LIVE = (JobState.QUEUED, JobState.ACTIVE, JobState.SCHEDULED, JobState.RETRYING,
        JobState.BLOCKED)  # fmt: skip


class StreamRates:
    """Events per second added to each queue's stream, between two gap checks (the
    stream's ``entries-added`` counter, read with an injectable clock)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, float] = {}

    def observe(self, queue: str, added: int) -> None:
        now = self.clock()
        last = self._last.get(queue)
        if last is not None and now <= last[0]:
            return  # no time passed: keep the earlier baseline (its events still count)
        self._last[queue] = (now, added)
        if last is not None:
            self.rates[queue] = max(0, added - last[1]) / (now - last[0])


def live_count(storage: Any, queue: str) -> int:
    counts = storage.counts(queue)
    return sum(int(counts.get(state, 0)) for state in LIVE)


def wants_sample(mirror: Any, queue: str) -> bool:
    """True when a gap on ``queue`` should be healed with counts and a sample: the queue is
    in that mode already, or it holds more waiting and running jobs than ``sample_above``."""
    return queue in mirror.sampled or live_count(mirror.storage, queue) > mirror.sample_above


def heal_sampled(mirror: Any, queue: str, why: str) -> int:
    """Write the sample's rows and record the counts; returns the rows written."""
    storage = mirror.storage
    started = time.time()
    position = storage.stream_position(queue)
    mirror.final.forget(queue)  # after a restart an id may start a new life at any time
    ids = storage.sample_ids(queue, mirror.sample_size)
    live = [r for r in storage.get_records(queue, ids).values() if r is not None]
    live.sort(key=lambda r: (r.created_at, r.job_id))  # new rows keep creation order
    for start in range(0, len(live), 500):
        part = live[start : start + 500]
        mirror._bisect([((queue, r.job_id), r) for r in part], mirror._write_records)
    storage.set_group_position(queue, mirror.group, position)
    counts = storage.counts(queue)
    before = mirror.sampled.get(queue, {})
    mode = {
        "since": before.get("since", round(started, 3)), "at": round(started, 3), "why": why,
        "counts": {state.value: int(n) for state, n in counts.items()},
        "records": max(int(before.get("records", 0)), sum(int(counts.get(s, 0)) for s in LIVE)),
        "sampled": len(live),
    }  # fmt: skip
    mirror.sampled[queue] = mode
    storage.set_mirror_sampled(queue, mode)
    mirror.resyncs += 1
    storage.record_mirror_gap(queue, {
        "at": round(started, 3), "why": why, "rows": len(live), "mode": "sampled",
        "seconds": round(time.time() - started, 3), "consumer": mirror.consumer,
    })  # fmt: skip
    logger.warning(
        "%s: %s; showing counts and a sample of %d records (the queue is too big to re-read "
        "while the mirror is behind)", queue, why, len(live),
    )  # fmt: skip
    return len(live)


def exact_fits(mirror: Any, queue: str) -> bool:
    """Whether a full re-read of ``queue`` can be done now without the cap trimming unread
    events meanwhile (see the module docstring)."""
    storage = mirror.storage
    rate = mirror.rates.rates.get(queue)
    if rate is None:  # one observation only: wait for the next check
        return False
    if storage.group_backlog(queue, mirror.group)[0] > mirror.batch:
        return False
    mode = mirror.sampled.get(queue, {})
    records = max(live_count(storage, queue), int(mode.get("records", 0)))
    expected = rate * records * mirror.seconds_per_record
    return expected < storage.events_maxlen / 2


def back_to_exact(mirror: Any, queue: str) -> bool:
    """Re-read ``queue`` in full when that fits, and leave the sampled mode unless the cap
    trimmed unread events meanwhile. True when the queue is exact again."""
    if queue not in mirror.sampled or not exact_fits(mirror, queue):
        return False
    mirror.heal_exact(queue, "caught up: every record re-read (exact rows again)")
    if mirror.storage.events_lost(queue, mirror.group):
        return False  # the next check heals the new gap (sampled again)
    leave(mirror, queue)
    return True


def leave(mirror: Any, queue: str) -> None:
    if mirror.sampled.pop(queue, None) is not None:
        mirror.storage.set_mirror_sampled(queue, None)
        logger.warning("%s: exact rows again (every record re-read)", queue)


def differs(row: tuple | None, state: tuple) -> bool:
    """Whether a row (state, attempts, finished ms) must be rewritten from a record whose
    (state, attempts, finished ms) is ``state``: rows of unfinished jobs always are (their
    progress, logs and lease move without a state change); a finished job's row is right
    when the same run (attempts, finish time) ended it in the same state."""
    if row is None or state[0] not in FINAL:
        return True
    return row != state
