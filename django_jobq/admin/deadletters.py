"""Queue-level "retry all dead letters" / "purge dead letters", for any number of them.

A selection in the job list stops at ``MAX_BULK`` jobs (each one storage call, and one row
in the admin's history); a queue with 50,000 dead letters after an outage needs one button.
The work goes through the Queue API in chunks of ``CHUNK`` ids, for at most ``TIME_BUDGET``
seconds per request so that no proxy times the page out: the summary then says how many are
left and goes on by itself. Nothing is lost when a request stops: every chunk is finished
(each id its own atomic step in the storage) and the dead-letter list is the progress.

A run touches the dead letters present when the operator confirmed, each once: ``since`` (that
moment, carried from request to request) leaves alone every dead letter that failed after it.
Without it, jobs that keep failing came back as the newest dead letters and each round retried
them again, so a run over 99,980 jobs never ended (issue 37, defect 1). Walking newest first
with an offset past what was left alone is safe while jobs fail meanwhile: a new dead letter
enters before the walk's position (it is the newest) or is left alone where it is met.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..job import RetryOutcome
from .common import queue_for

CHUNK = 500
TIME_BUDGET = 10.0
VERBS = ("retry", "purge")


@dataclass
class Summary:
    """What one request did to a queue's dead letters."""

    queue: str
    verb: str
    done: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    left: int = 0
    stopped_early: bool = False
    error: str | None = None
    since: int = 0  # epoch ms of the confirmation: dead letters newer than it are left alone
    newer: int = 0  # dead letters met (not all) that failed after ``since``

    @property
    def finished(self) -> bool:
        """Every dead letter present at ``since`` was handled: nothing to go on with."""
        return not self.stopped_early and self.error is None

    @property
    def text(self) -> str:
        action = "requeued" if self.verb == "retry" else "purged"
        parts = [f"Queue {self.queue}: {self.done} dead letter(s) {action}"]
        skipped = {k: v for k, v in self.outcomes.items() if k != RetryOutcome.RETRIED.value}
        if skipped:
            parts.append("not requeued: " + ", ".join(f"{n} {k}" for k, n in skipped.items()))
        if self.error:
            parts.append(f"stopped by an error: {self.error}")
        if self.newer:
            parts.append("dead letters that failed after the start were left alone")
        if self.stopped_early:
            parts.append("time budget used: going on with the rest")
        elif self.left:
            parts.append(f"{self.left} dead now")
        return "; ".join(parts) + "."


def run(
    name: str, verb: str, *, since: int | None = None, budget: float | None = None,
    chunk: int | None = None,
) -> Summary:  # fmt: skip
    """Retry or purge the queue's dead letters that failed before ``since`` (epoch ms; None:
    now, a new run), newest first, chunk by chunk."""
    queue = queue_for(name)
    summary = Summary(name, verb, since=int(time.time() * 1000) if since is None else since)
    deadline = time.monotonic() + (TIME_BUDGET if budget is None else budget)
    chunk = CHUNK if chunk is None else chunk
    offset = 0  # dead letters left in place (newer, or not retryable): walked past
    newer: set[str] = set()
    # Ids handled by this request: a job retried and failed again within the millisecond of
    # ``since`` is not newer by the clock, but it is by this set.
    touched: set[str] = set()
    try:
        read = 0
        while True:  # at least one chunk a request, so that a run always moves on
            if read and time.monotonic() >= deadline:
                summary.stopped_early = True
                break
            read += 1
            records = queue.storage.dead_letters(queue.name, offset, chunk)
            if not records:
                break
            ids = []
            for r in records:
                if (r.finished_at or 0) > summary.since or r.job_id in touched:
                    newer.add(r.job_id)
                    offset += 1
                else:
                    ids.append(r.job_id)
            if not ids:
                continue
            touched.update(ids)
            if verb == "purge":
                purged = queue.purge_dead(ids)
                summary.done += purged
                offset += len(ids) - purged
            else:
                outcomes = queue.retry_many(ids)
                summary.outcomes.update(o.value for o in outcomes.values())
                summary.done = summary.outcomes[RetryOutcome.RETRIED.value]
                offset += sum(1 for o in outcomes.values() if o is not RetryOutcome.RETRIED)
        summary.newer = len(newer)
    except Exception as exc:  # storage unreachable mid-way: say what was done before it
        summary.error = f"{type(exc).__name__}: {exc}"
    try:
        summary.left = queue.count_dead()
    except Exception:  # the error above already says why
        summary.left = 0
    return summary
