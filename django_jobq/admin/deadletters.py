"""Queue-level "retry all dead letters" / "purge dead letters", for any number of them.

A selection in the job list stops at ``MAX_BULK`` jobs (each one storage call, and one row
in the admin's history); a queue with 50,000 dead letters after an outage needs one button.
The work goes through the Queue API in chunks of ``CHUNK`` ids, for at most ``TIME_BUDGET``
seconds per request so that no proxy times the page out: the summary then says how many are
left and offers to go on. Nothing is lost when a request stops: every chunk is finished (each
id its own atomic step in the storage) and the dead-letter list is the progress.
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

    @property
    def text(self) -> str:
        action = "requeued" if self.verb == "retry" else "purged"
        parts = [f"Queue {self.queue}: {self.done} dead letter(s) {action}"]
        skipped = {k: v for k, v in self.outcomes.items() if k != RetryOutcome.RETRIED.value}
        if skipped:
            parts.append("not requeued: " + ", ".join(f"{n} {k}" for k, n in skipped.items()))
        if self.error:
            parts.append(f"stopped by an error: {self.error}")
        if self.left:
            more = " (time budget used: go on for the rest)" if self.stopped_early else ""
            parts.append(f"{self.left} still dead{more}")
        return "; ".join(parts) + "."


def run(name: str, verb: str, *, budget: float = TIME_BUDGET, chunk: int = CHUNK) -> Summary:
    """Retry or purge the queue's dead letters, newest first, chunk by chunk."""
    queue = queue_for(name)
    summary = Summary(name, verb)
    deadline = time.monotonic() + budget
    offset = 0  # dead letters left in place (not retryable): skipped over, not retried again
    try:
        while True:
            if time.monotonic() >= deadline:
                summary.stopped_early = True
                break
            ids = [r.job_id for r in queue.storage.dead_letters(queue.name, offset, chunk)]
            if not ids:
                break
            if verb == "purge":
                purged = queue.purge_dead(ids)
                summary.done += purged
                offset += len(ids) - purged
            else:
                outcomes = queue.retry_many(ids)
                summary.outcomes.update(o.value for o in outcomes.values())
                summary.done = summary.outcomes[RetryOutcome.RETRIED.value]
                offset += sum(1 for o in outcomes.values() if o is not RetryOutcome.RETRIED)
    except Exception as exc:  # storage unreachable mid-way: say what was done before it
        summary.error = f"{type(exc).__name__}: {exc}"
    try:
        summary.left = queue.count_dead()
    except Exception:  # the error above already says why
        summary.left = 0
    return summary
