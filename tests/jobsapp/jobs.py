"""Handlers used by the subprocess tests (runworker autodiscovers this module)."""

import json
import os
import threading
import time
from pathlib import Path

from django_jobq import PermanentError, RateLimited, handler
from django_jobq.broadcast import subscriber
from django_jobq.contrib.celery import celery_task
from django_jobq.tasks import task


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


@handler("tests-orm")
def orm(job):
    """Handler code that uses the ORM: a query on payload["alias"], then a sleep of
    payload["seconds"] while the thread's connection is still open."""
    from django.db import connections

    with connections[job.payload["alias"]].cursor() as cursor:
        cursor.execute("SELECT 1")
    time.sleep(job.payload.get("seconds", 0))
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


def onfail_ledger(payload, job, error):
    """Failure handler of tests-onfail: appends "start <id> <pid> <tries>", sleeps
    payload["first_call_seconds"] on its first call only, then appends "end <id> <pid> <tries>"
    (tests/test_failure_processes.py kills the worker in between)."""
    path = Path(payload["ledger"])
    with path.open("a") as fh:
        fh.write(f"start {job.id} {os.getpid()} {job.tries} {error['type']}\n")
    if job.tries == 1:
        time.sleep(payload.get("first_call_seconds", 0))
    with path.open("a") as fh:
        fh.write(f"end {job.id} {os.getpid()} {job.tries} {error['type']}\n")


@handler("tests-onfail", on_failure=onfail_ledger)
def onfail(job):
    raise PermanentError("fails for the failure handler")


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


# -- pools (tests/test_pools.py): these run in process-pool children too ----------------------


@handler("tests-cpu")
def cpu(job):
    """Pure-Python work for payload["seconds"] of wall time: holds its process's GIL."""
    deadline = time.monotonic() + job.payload["seconds"]
    n = 0
    while time.monotonic() < deadline:
        n += sum(i * i for i in range(1000))
    return {"pid": os.getpid(), "attempt": job.attempt}


@handler("tests-hang", hard_timeout=1.0)
def hang(job):
    if job.payload.get("hang"):
        time.sleep(60)
    return {"pid": os.getpid()}


@handler("tests-soft", timeout=0.3)
def soft(job):
    deadline = time.monotonic() + 10
    while not job.is_cancelled() and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"stopped": job.is_cancelled()}


@handler("tests-crash")
def crash(job):
    if job.payload.get("crash") and job.attempt == 1:
        os._exit(3)
    return {"pid": os.getpid(), "attempt": job.attempt}


@handler("tests-report")
def report(job):
    job.set_progress({"pid": os.getpid()})
    job.log(f"child {os.getpid()} at work")
    return os.getpid()


ASYNC_STATE = {"running": 0, "peak": 0}


@handler("tests-async")
async def in_flight(job):
    import asyncio

    ASYNC_STATE["running"] += 1
    ASYNC_STATE["peak"] = max(ASYNC_STATE["peak"], ASYNC_STATE["running"])
    try:
        await asyncio.sleep(job.payload.get("sleep", 0.2))
    finally:
        ASYNC_STATE["running"] -= 1
    return job.payload.get("n")


@handler("tests-async-hang", hard_timeout=0.5)
async def async_hang(job):
    import asyncio

    await asyncio.sleep(60)


@handler("tests-batch", batch=10)
def batch(jobs):
    """Sums per job; a payload with "bad" fails just that job; pid and batch size reported."""
    out = []
    for job in jobs:
        if job.payload.get("bad"):
            out.append(PermanentError(f"bad item {job.id}"))
        else:
            out.append({"n": job.payload["n"] * 2, "size": len(jobs), "pid": os.getpid()})
    return out


@handler("tests-stubborn")
def stubborn(job):
    """Ignores its cancel flag for payload["seconds"]: only a kill stops it early."""
    time.sleep(job.payload.get("seconds", 30))
    return "finished anyway"


@handler("tests-async-sleep")
async def async_sleep(job):
    import asyncio

    await asyncio.sleep(job.payload.get("seconds", 30))
    return "finished anyway"


@handler("tests-soft-forever")
def soft_forever(job):
    """Polls its cancel flag (no timeout of its own): stops when an operator cancels it."""
    deadline = time.monotonic() + 30
    while not job.is_cancelled() and time.monotonic() < deadline:
        time.sleep(0.01)
    return "stopped"


@handler("tests-job-hang")
def job_hang(job):
    """No timeout of its own: per-job timeouts (enqueue(..., hard_timeout=)) stop it."""
    time.sleep(job.payload.get("seconds", 0))
    return {"pid": os.getpid()}


FLOW_CALLS: list[str] = []  # ids of flow parents whose handler ran (in-process workers)


@handler("tests-flow-a")
@handler("tests-flow-leaf")
def flow_leaf(job):
    if job.payload.get("fail"):
        raise PermanentError(f"leaf {job.id} refuses")
    time.sleep(job.payload.get("seconds", 0))
    return job.payload["value"]


@handler("tests-flow-sum")
def flow_sum(job):
    FLOW_CALLS.append(job.id)
    return {
        "payload": job.payload,
        "sum": sum(job.child_results.values()),
        "children": [[c.queue, c.job_id, c.state.value, c.value] for c in job.children],
    }


@handler("tests-flow-step")
def flow_step(job):
    """A chain step: the previous step's result (0 for the first) plus payload["add"]."""
    before = job.previous_result if job.children else 0
    return before * job.payload.get("times", 1) + job.payload["add"]


def _signal_ledger(signal, sender, **kwargs):
    """Appends one JSON line per django_jobq signal received in this process (with its pid):
    tests/test_signal_processes.py checks which process sent what."""
    from django_jobq import signals

    name = next(n for n in dir(signals) if getattr(signals, n) is signal)
    line = {"signal": name, "pid": os.getpid(), **{k: v for k, v in kwargs.items()}}
    with Path(os.environ["JOBQ_TEST_SIGNAL_LOG"]).open("a") as fh:
        fh.write(json.dumps(line, default=str) + "\n")


if os.environ.get("JOBQ_TEST_SIGNAL_LOG"):  # set by the subprocess signal tests only
    from django_jobq import signals as _signals

    for _signal in _signals.ALL:
        _signal.connect(_signal_ledger, weak=False, dispatch_uid="tests-signal-ledger")


if os.environ.get("JOBQ_TEST_OTEL_LOG"):  # set by tests/test_tracing_processes.py only
    # The worker's global tracer provider, exporting each ended span as one JSON line.
    from opentelemetry import trace as _trace
    from opentelemetry.sdk.trace import TracerProvider as _TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor as _Simple
    from opentelemetry.sdk.trace.export import SpanExporter as _SpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult as _Result

    class _JsonLines(_SpanExporter):
        def export(self, spans):
            with Path(os.environ["JOBQ_TEST_OTEL_LOG"]).open("a") as fh:
                for span in spans:
                    fh.write(json.dumps({
                        "name": span.name, "kind": span.kind.name, "pid": os.getpid(),
                        "trace_id": span.context.trace_id, "span_id": span.context.span_id,
                        "parent_id": span.parent.span_id if span.parent else None,
                        "status": span.status.status_code.name,
                        "attributes": dict(span.attributes),
                        "events": [e.name for e in span.events],
                        "links": [[ln.context.trace_id, ln.context.span_id]
                                  for ln in span.links],
                    }) + "\n")  # fmt: skip
            return _Result.SUCCESS

    _provider = _TracerProvider()
    _provider.add_span_processor(_Simple(_JsonLines()))
    _trace.set_tracer_provider(_provider)


@subscriber("tests-bcast", group="alpha", start="earliest", max_stalls=3)
@subscriber("tests-bcast", group="beta", start="earliest", max_stalls=3)
def bcast_ledger(job):
    """Appends "start"/"done" lines (group, message id, pid) around a sleep of
    payload["seconds"] to payload["ledger"]: the broadcast fault test reads who handled what."""
    line = f"{job.meta['group']} {job.id} {os.getpid()}"
    with Path(job.payload["ledger"]).open("a") as fh:
        fh.write(f"start {line}\n")
    time.sleep(job.payload.get("seconds", 0))
    with Path(job.payload["ledger"]).open("a") as fh:
        fh.write(f"done {line}\n")


@subscriber("tests-bcast-timeout", group="gamma", start="earliest", timeout=0.5, min_backoff=0,
            max_backoff=0)  # fmt: skip
def bcast_timeout(job):
    """First attempt: runs until its 0.5 s timeout asks it to stop (``job.is_cancelled()``),
    writes "stopped", and fails; the next attempt writes "done" (group, id, attempt, pid)."""
    line = f"{job.meta['group']} {job.id} {job.attempt} {os.getpid()}"
    if job.attempt == 1:
        job.cancel_event.wait(60)
        with Path(job.payload["ledger"]).open("a") as fh:
            fh.write(f"stopped {line} {int(job.is_cancelled())}\n")
        raise RuntimeError("stopped by its timeout")
    with Path(job.payload["ledger"]).open("a") as fh:
        fh.write(f"done {line} 0\n")


# Task functions (tests/test_tasks_processes.py): two job types on one queue, one async.
@task(queue="tests-tasks", name="tests.proc.add", max_attempts=2)
def proc_add(a: int, b: int = 0) -> dict:
    return {"sum": a + b, "pid": os.getpid()}


@task(queue="tests-tasks", name="tests.proc.shout")
async def proc_shout(text: str) -> str:
    return text.upper()


# Task failure handlers and canvas handles (tests/test_task_handles_processes.py).
def proc_doomed_told(payload, job, error):
    """The failure handler of ``proc_doomed``: one "told" line (task, id, n, error, pid)."""
    ledger, n = payload["args"]
    with Path(ledger).open("a") as fh:
        fh.write(f"told {job.task} {job.id} {n} {error['type']} {os.getpid()}\n")


@task(queue="tests-tasks", name="tests.proc.doomed", max_attempts=1, on_failure=proc_doomed_told)
def proc_doomed(ledger: str, n: int) -> None:
    raise ValueError(f"doomed {n}")


@task(queue="tests-tasks", name="tests.proc.inc", max_attempts=1)
def proc_inc(x: int, fail: bool = False) -> int:
    if fail:
        raise PermanentError(f"inc({x}) told to fail")
    return x + 1


@task(queue="tests-tasks", name="tests.proc.total", max_attempts=1)
def proc_total(values: list) -> int:
    return sum(values)


@subscriber("tests-bcast-hard", group="hung", start="earliest", hard_timeout=1, max_attempts=2,
            min_backoff=0, max_backoff=0)  # fmt: skip
@subscriber("tests-bcast-hard", group="calm", start="earliest")
def bcast_hard(job):
    """Appends "start"/"done" lines (group, id, attempt, pid) to payload["ledger"]. In group
    "hung" the first attempt (every attempt when payload["always"]) never returns by itself:
    only the process pool's hard timeout (1 s) ends it, by killing the child."""
    line = f"{job.meta['group']} {job.id} {job.attempt} {os.getpid()}"
    with Path(job.payload["ledger"]).open("a") as fh:
        fh.write(f"start {line}\n")
    if job.meta["group"] == "hung" and (job.attempt == 1 or job.payload.get("always")):
        threading.Event().wait()  # never set
    with Path(job.payload["ledger"]).open("a") as fh:
        fh.write(f"done {line}\n")


def _effect(job):
    """A non-idempotent effect: one row per run in ``jobq_test_effects`` (nothing stops a
    second), on payload["alias"], then a sleep of payload["seconds"]. With payload["die"] in a
    directory, the first run of the job SIGKILLs its own worker right after the effect: the
    chosen crash point between a handler's writes and its job's completion; with
    payload["die_after_commit"] too, right after the handler's transaction commits instead
    (an atomic handler on Redis: after its outcome is recorded, before Redis hears of it)."""
    from django.db import connections, transaction

    alias = job.payload["alias"]
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO jobq_test_effects (job_id) VALUES (%s)", [job.id])
    die = job.payload.get("die")
    if die and not (Path(die) / job.id).exists():
        (Path(die) / job.id).touch()
        if job.payload.get("die_after_commit"):
            transaction.on_commit(lambda: os.kill(os.getpid(), 9), using=alias)
        else:
            os.kill(os.getpid(), 9)
    time.sleep(job.payload.get("seconds", 0))
    return job.id


@handler("tests-effect")
def plain_effect(job):
    return _effect(job)


# Registered only for the processes of tests/test_atomic_processes.py: elsewhere a worker of
# the memory backend serving every queue, or manage.py check with it, would refuse it.
if os.environ.get("JOBQ_TEST_ATOMIC") == "1":

    @handler("tests-atomic", atomic=True)
    def atomic_effect(job):
        return _effect(job)
