"""Handlers used by the subprocess tests (runworker autodiscovers this module)."""

import os
import time
from pathlib import Path

from django_jobq import PermanentError, RateLimited, handler
from django_jobq.celery_compat import celery_task


@handler("tests-echo")
def echo(job):
    return {"echo": job.payload, "attempt": job.attempt}


@handler("tests-slow")
def slow(job):
    """Sleeps payload["seconds"], then appends its id to payload["ledger"] (one line per run)."""
    time.sleep(job.payload.get("seconds", 0))
    ledger = job.payload.get("ledger")
    if ledger:
        with Path(ledger).open("a") as fh:
            fh.write(f"{job.id} {os.getpid()}\n")
    return job.id


@handler("tests-ledger")
def ledger(job):
    """Appends "start" and "end" lines (id, pid, epoch seconds) around a sleep of
    payload["seconds"]: the flow-control tests check overlaps and rates from them. With
    payload["limited_once"] the first run of each job says "rate limited, retry in 0.2 s"."""
    path = Path(job.payload["ledger"])
    if job.payload.get("limited_once") and not (path.parent / f"limited-{job.id}").exists():
        (path.parent / f"limited-{job.id}").touch()
        raise RateLimited(0.2)
    with path.open("a") as fh:
        fh.write(f"start {job.id} {os.getpid()} {time.time():.6f} {job.attempt}\n")
    time.sleep(job.payload.get("seconds", 0))
    with path.open("a") as fh:
        fh.write(f"end {job.id} {os.getpid()} {time.time():.6f} {job.attempt}\n")
    return job.payload.get("n")


@handler("tests-fail")
def fail(job):
    if job.payload.get("permanent"):
        raise PermanentError("no point retrying")
    raise ValueError(f"boom on attempt {job.attempt}")


# -- Celery tasks run by django_jobq (tests/test_celery_interop.py) ---------------------------


@celery_task("tests.celery.add")
def celery_add(x, y):
    return x + y


@celery_task("tests.celery.explode", max_retries=0)
def celery_explode(message):
    raise ValueError(message)


@celery_task("tests.celery.record", max_retries=5)
def celery_record(ledger, n, seconds=0.0):
    """Appends n to the ledger file once per run (duplicates show as repeated lines)."""
    time.sleep(seconds)
    with Path(ledger).open("a") as fh:
        fh.write(f"{n}\n")
    return n
