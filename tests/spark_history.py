"""A generated job history with known answers, for the Spark pipeline tests.

``generate`` builds jobs and their events (claims, runs, retries, stalls, failures) from a seeded
random source; ``store`` writes them as ``Job`` / ``JobEvent`` rows; ``reference_metrics``
computes every analytics figure from the same list in plain Python, by the definitions in
``django_jobq/spark/metrics.py``, for the Spark results to be compared with.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from dataclasses import dataclass, field

from django_jobq.models import Job, JobEvent

START = dt.datetime(2026, 3, 1, 22, 40, tzinfo=dt.UTC)  # the history crosses midnight
HANDLERS = {"emails": "app.jobs.send_email", "reports": "app.jobs.build_report"}
WORKERS = ("w1", "w2", "w3")
ERRORS = (
    ("ValueError", "bad address"),
    ("ValueError", "bad address"),
    ("ValueError", "empty body"),
    ("TimeoutError", "smtp timed out"),
)
PERIOD_SECONDS = {"minute": 60, "hour": 3600, "day": 86_400}
RUNNABLE = ("queued", "released", "stalled")
RUN_OUTCOMES = ("completed", "failed", "retrying")
BUSY_OUTCOMES = (*RUN_OUTCOMES, "released", "postponed")


@dataclass
class GenJob:
    queue: str
    job_id: str
    handler: str
    events: list[tuple[str, int, str]] = field(default_factory=list)  # kind, epoch ms, worker
    error: dict | None = None

    @property
    def state(self) -> str:
        return self.events[-1][0]


def _attempts(rng: random.Random, job: GenJob, t: int) -> None:
    for attempt in range(1, 4):
        t += rng.randint(0, 5_000)
        worker = rng.choice(WORKERS)
        job.events.append(("active", t, worker))
        roll = rng.random()
        if roll < 0.08:  # the worker died: the reaper requeues when the lease expires
            t += 30_000
            job.events.append(("stalled", t, ""))
            continue
        t += rng.randint(5, 3_000)
        if roll < 0.2 and attempt < 3:
            job.events.append(("retrying", t, worker))
            t += 1_000
            job.events.append(("queued", t, ""))
            continue
        if roll < 0.3:
            etype, message = rng.choice(ERRORS)
            job.error = {"type": etype, "message": message, "traceback": ""}
            job.events.append(("failed", t, worker))
            return
        job.events.append(("completed", t, worker))
        return
    etype, message = rng.choice(ERRORS)
    job.error = {"type": etype, "message": message, "traceback": ""}
    job.events.append(("failed", t, ""))


def generate(n_jobs: int = 400, seed: int = 7, start: dt.datetime = START) -> list[GenJob]:
    rng = random.Random(seed)
    base = int(start.timestamp() * 1000)
    jobs = []
    for i in range(n_jobs):
        queue = rng.choice(tuple(HANDLERS))
        job = GenJob(queue, f"job-{i}", HANDLERS[queue])
        t = base + rng.randint(0, 3 * 3_600_000)
        job.events.append(("queued", t, ""))
        _attempts(rng, job, t)
        jobs.append(job)
    return jobs


def _dt(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def store(jobs: list[GenJob], using: str) -> None:
    """Write the history as the mirror or the database backend would have left it."""
    rows = [
        Job(
            queue=j.queue, job_id=j.job_id, handler=j.handler, state=j.state, error=j.error,
            attempts=sum(1 for e in j.events if e[0] == "active"),
            created_at=_dt(j.events[0][1]), finished_at=_dt(j.events[-1][1]),
        )
        for j in jobs
    ]  # fmt: skip
    Job.objects.using(using).bulk_create(rows, batch_size=1000)
    pks = dict(Job.objects.using(using).values_list("job_id", "id"))
    events = [
        JobEvent(job_id=pks[j.job_id], queue=j.queue, kind=kind, at=_dt(at), worker=worker)
        for j in jobs
        for kind, at, worker in j.events
    ]
    JobEvent.objects.using(using).bulk_create(events, batch_size=2000)


def _bucket(ms: int, period: str) -> int:
    size = PERIOD_SECONDS[period] * 1000
    return ms - ms % size  # UTC buckets: epoch ms is UTC


def _facts(job: GenJob):
    """(kind, at, wait, run, busy, busy_worker) per event, as metrics.attempt_facts defines."""
    prev = None
    for kind, at, worker in job.events:
        wait = run = busy = busy_worker = None
        if prev is not None:
            span = at - prev[1]
            if kind == "active" and prev[0] in RUNNABLE:
                wait = span
            if prev[0] == "active" and kind in RUN_OUTCOMES:
                run = span
            if prev[0] == "active" and kind in BUSY_OUTCOMES:
                busy, busy_worker = span, prev[2] or worker
        yield kind, at, wait, run, busy, busy_worker
        prev = (kind, at, worker)


def reference_metrics(jobs: list[GenJob]) -> dict[tuple, dict]:
    """Every metric by (queue, handler, period, bucket start as epoch ms)."""
    acc: dict[tuple, dict] = defaultdict(
        lambda: {"kinds": defaultdict(int), "wait": [], "run": [], "busy": 0.0, "workers": set(),
                 "errors": defaultdict(lambda: defaultdict(int))}
    )  # fmt: skip
    for job in jobs:
        for kind, at, wait, run, busy, worker in _facts(job):
            for period in PERIOD_SECONDS:
                a = acc[(job.queue, job.handler, period, _bucket(at, period))]
                a["kinds"][kind] += 1
                if wait is not None:
                    a["wait"].append(wait)
                if run is not None:
                    a["run"].append(run)
                if busy is not None:
                    a["busy"] += busy
                    a["workers"].add(worker)
                if kind == "failed":
                    a["errors"][job.error["type"]][job.error["message"]] += 1
    return {key: _figures(key[2], a) for key, a in acc.items()}


def _figures(period: str, a: dict) -> dict:
    k = a["kinds"]
    finished = k["completed"] + k["failed"] + k["retrying"]
    seconds = PERIOD_SECONDS[period]
    classes = sorted(
        (
            {"type": t, "count": sum(m.values()),
             "messages": sorted(({"message": msg, "count": n} for msg, n in m.items()),
                                key=lambda x: (-x["count"], x["message"]))[:3]}
            for t, m in a["errors"].items()
        ),
        key=lambda c: (-c["count"], c["type"]),
    )  # fmt: skip
    workers = len(a["workers"])
    return {
        "started": k["active"], "completed": k["completed"], "failed": k["failed"],
        "retried": k["retrying"], "stalled": k["stalled"],
        "throughput": k["completed"] / seconds,
        "retry_rate": k["retrying"] / finished if finished else None,
        "stall_rate": k["stalled"] / k["active"] if k["active"] else None,
        "busy_ms": round(a["busy"]), "workers": workers,
        "utilisation": a["busy"] / (seconds * 1000 * workers) if workers else None,
        "failure_classes": classes, "wait": sorted(a["wait"]), "run": sorted(a["run"]),
    }  # fmt: skip


def percentile_ok(value: float | None, ordered: list[float], p: float, accuracy: int) -> bool:
    """``value`` is an element whose rank is within percentile_approx's error of ``p``."""
    if not ordered:
        return value is None
    n = len(ordered)
    slack = n / accuracy + 1
    lo = ordered[max(0, int(p * n - slack))]
    hi = ordered[min(n - 1, int(p * n + slack))]
    return value is not None and lo <= value <= hi
