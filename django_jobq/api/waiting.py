"""The bounded long-poll of ``GET .../result?wait=<seconds>``.

The database and memory backends wait on the job itself (``wait_for_outcome`` needs no
registration there). Redis hands outcomes only to waiters registered at enqueue, so a reader
who arrives later follows the queue's event stream instead and re-reads the job when an event
names it. Either way the wait is cut into slices, each ending in a fresh read of the job: an
outcome that slipped in before the first slice started is seen one slice late, never lost."""

from __future__ import annotations

import time

from ..errors import EventsLost
from ..job import JobResult
from ..queue.core import Queue
from ..states import TERMINAL_STATES

MAX_WAIT = 30.0
SLICE = 1.0


def is_final(result: JobResult | None) -> bool:
    return result is None or result.state in TERMINAL_STATES


def wait_for_result(queue: Queue, job_id: str, timeout: float) -> JobResult | None:
    """The job's result once it is final, or as it stands after ``timeout`` seconds (at most
    ``MAX_WAIT``). None when the job is unknown (or its record expired meanwhile)."""
    deadline = time.monotonic() + min(timeout, MAX_WAIT)
    queue = queue.locate(job_id)  # a sharded queue: the partition that holds the job
    follow_events = hasattr(queue.storage, "read_group")  # Redis: see the module docstring
    cursor = "$"
    result = queue.get_result(job_id)
    while not is_final(result) and (remaining := deadline - time.monotonic()) > 0:
        # Never under 10 ms: Redis reads a block of 0 ms as "forever".
        block = max(min(remaining, SLICE), 0.01)
        if follow_events:
            try:
                events = queue.storage.read_events(queue.name, after=cursor, count=500,
                                                   block=block)  # fmt: skip
            except EventsLost:  # a burst trimmed past our place: look at the job, go on
                cursor, events = "$", []
                result = queue.get_result(job_id)
                continue
            if events:
                cursor = events[-1].id
                if all(e.job_id != job_id for e in events):
                    continue  # other jobs moved; from a known cursor nothing is missed
        else:
            queue.storage.wait_for_outcome(queue.name, job_id, block)
        result = queue.get_result(job_id)
    return result
