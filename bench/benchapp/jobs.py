"""The handler the benchmark's worker runs: a no-op, so the figures are the queue's own cost."""

import os

from django_jobq import handler
from django_jobq.job import Job

# JOBQ_BENCH_ATOMIC=1 (``bench.atomic``, database backend only): the same no-op as an
# ``atomic=True`` handler, its completion written in its own transaction.
ATOMIC = os.environ.get("JOBQ_BENCH_ATOMIC") == "1"


@handler("bench", atomic=ATOMIC)
def noop(job: Job) -> int:
    """Return a tiny result so the completion path (result stored, waiter fed) is exercised."""
    return 1
