"""The handler the benchmark's worker runs: a no-op, so the figures are the queue's own cost."""

from django_jobq import handler
from django_jobq.job import Job


@handler("bench")
def noop(job: Job) -> int:
    """Return a tiny result so the completion path (result stored, waiter fed) is exercised."""
    return 1
