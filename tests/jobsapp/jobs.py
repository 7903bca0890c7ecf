"""Handlers used by the subprocess tests (runworker autodiscovers this module)."""

import os
import time
from pathlib import Path

from django_jobq import PermanentError, handler


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


@handler("tests-fail")
def fail(job):
    if job.payload.get("permanent"):
        raise PermanentError("no point retrying")
    raise ValueError(f"boom on attempt {job.attempt}")
