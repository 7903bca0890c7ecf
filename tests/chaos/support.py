"""Helpers shared by the fault tests: enqueueing into the ledger, waiting for the end."""

from __future__ import annotations

import time
from collections.abc import Callable

from django_jobq.queue import Queue

from .conftest import completed
from .ledger import Ledger


def enqueue_recorded(queue: Queue, ledger: Ledger, ids: list[str], payload: dict,
                     **options) -> None:  # fmt: skip
    """Enqueue in chunks; an id goes into ``enqueued`` only after the storage accepted it."""
    for i in range(0, len(ids), 1000):
        results = queue.enqueue_many(
            [{"id": job_id, "payload": payload, **options} for job_id in ids[i : i + 1000]]
        )
        ledger.record_enqueued(r.job_id for r in results if r.created)


def wait_all_completed(queue: Queue, ids: list[str], timeout: float,
                       tick: Callable[[], None] | None = None) -> list[str]:  # fmt: skip
    """Polls until every id completed (or ``timeout``); ``tick`` runs between polls."""
    deadline = time.monotonic() + timeout
    done: list[str] = []
    while time.monotonic() < deadline:
        done = completed(queue, ids)
        if len(done) == len(ids):
            break
        if tick is not None:
            tick()
        time.sleep(0.5)
    return done


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]
