"""Handlers of the fault tests, run by real ``runworker`` processes (``tests.chaos.settings``
adds this package as an app, so the worker's autodiscovery imports this module)."""

from __future__ import annotations

import os
import time

from django_jobq import handler

from . import ledger


@handler("chaos-ledger")
def ledger_job(job):
    """Writes its run to the PostgreSQL ledger, works payload["seconds"], upserts its effect."""
    run_id = ledger.start_run(job.id, job.attempt, job.token, time.time())
    time.sleep(job.payload.get("seconds", 0))
    ledger.finish_run(run_id, job.id, time.time())
    return job.id


@handler("chaos-poison")
def poison_job(job):
    """A healthy job records its run; poison ones raise, or kill the (process-pool) child."""
    mode = job.payload.get("mode", "ok")
    if mode == "raise":
        raise ValueError(f"poison job {job.id} raises on every attempt")
    if mode == "kill":
        os._exit(9)  # the child process dies mid-job, as a segfaulting extension would
    run_id = ledger.start_run(job.id, job.attempt, job.token, time.time())
    time.sleep(job.payload.get("seconds", 0))
    ledger.finish_run(run_id, job.id, time.time())
    return job.id
