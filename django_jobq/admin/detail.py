"""Everything the job page shows about one job: its data, its outcome, its history, its
relatives, and the actions this user may take on it now."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse

from .. import envelope
from ..job import ms_to_datetime
from ..models import Job, Schedule
from ..states import JobState
from .actions import ACTIONS
from .common import (
    decode_blob,
    duration,
    has_mirror,
    jobs_alias,
    mirror_banner,
    pretty,
    queue_for,
)

#: The timeline shows at most this many events (a job retried for days can have thousands).
TIMELINE_LIMIT = 500

#: Which actions make sense in which state (the storage would refuse the others anyway).
ACTION_STATES = {
    "cancel": {
        JobState.QUEUED,
        JobState.SCHEDULED,
        JobState.RETRYING,
        JobState.BLOCKED,
        JobState.ACTIVE,
    },
    "force_cancel": {JobState.ACTIVE},
    "retry": {JobState.FAILED, JobState.CANCELLED},
    "requeue_dead": {JobState.FAILED},
    "delete": {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED},
    "run_now": {JobState.SCHEDULED, JobState.RETRYING},
    "priority": {JobState.QUEUED, JobState.SCHEDULED, JobState.RETRYING},
}


def context(request: HttpRequest, admin: Any, job: Job) -> dict[str, Any]:
    live, live_error = _live_status(job)
    payload, meta = envelope.unwrap(job.content_type, decode_blob(job.payload, job.content_type))
    return {
        "title": f"Job {job.job_id}",
        "opts": admin.model._meta,
        "job": job,
        "live": live,
        "live_error": live_error,
        "mirror": has_mirror(),
        "payload": pretty(payload),
        "settings": {k: meta[k] for k in ("timeout", "hard_timeout") if k in meta},
        "result": _result(job),
        "error": job.error if isinstance(job.error, dict) else None,
        "progress": None if job.progress is None else pretty(job.progress),
        "logs": [(ms_to_datetime(at), line) for at, line in (job.logs or [])],
        "events": list(job.events.using(jobs_alias()).order_by("-at", "-id")[:TIMELINE_LIMIT]),
        "timing": _timing(job),
        "related": related(job, meta),
        "actions": _actions(request, job, live.state if live is not None else None),
        "mirror_banner": mirror_banner(),
    }


def _live_status(job: Job) -> tuple[Any, str | None]:
    """The storage's current view: with Redis the mirror row may lag by a batch."""
    if "~" in job.job_id:
        return None, None  # a reserved bookkeeping row of the database backend
    try:
        return queue_for(job.queue).get_status(job.job_id), None
    except Exception as exc:  # storage unreachable: the page still shows the row
        return None, f"{type(exc).__name__}: {exc}"


def _result(job: Job) -> str | None:
    if job.result is None:
        return None
    return pretty(decode_blob(job.result, job.content_type))


def _timing(job: Job) -> list[tuple[str, str]]:
    since = job.run_at if job.run_at and job.run_at > job.created_at else job.created_at
    rows = []
    if job.started_at:
        rows.append(("waited", duration((job.started_at - since).total_seconds() * 1000)))
    if job.started_at and job.finished_at:
        rows.append(("ran", duration((job.finished_at - job.started_at).total_seconds() * 1000)))
    return rows


#: Flow children listed on a parent's page (a fan-out of thousands would drown the page).
CHILDREN_SHOWN = 100


def related(job: Job, meta: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """Links to the job's relatives: the schedule that enqueued it, its flow parents and
    children (from its envelope), and for a singleton on the database backend its blocked
    successor (``<id>~next``) or, from the successor, the job. Exact lookups only: each is a
    probe of the (queue, job_id) index."""
    links: list[tuple[str, str, str]] = []
    alias = jobs_alias()
    base = job.job_id.split("~", 1)[0]
    if base.startswith("schedule."):
        name = base[len("schedule.") :].rsplit(".", 1)[0]
        schedule = Schedule.objects.using(alias).filter(name=name, queue=job.queue).first()
        if schedule is not None:
            url = reverse("admin:django_jobq_schedule_change", args=[schedule.pk])
            links.append(("enqueued by schedule", schedule.name, url))
    names = {f"{base}~next": "blocked successor", base: "the job this row belongs to"}
    names.pop(job.job_id, None)
    others = Job.objects.using(alias).filter(queue=job.queue, job_id__in=list(names))
    for other in others.only("id", "job_id", "state"):
        url = reverse("admin:django_jobq_job_change", args=[other.pk])
        links.append((names[other.job_id], f"{other.job_id} ({other.state})", url))
    return links + _flow_links(meta or {}, alias)


def _flow_links(meta: dict[str, Any], alias: str) -> list[tuple[str, str, str]]:
    """Parents this job is a child of, and its children, linked where the mirror has them."""
    raw_flow = meta.get("flow")
    flow: dict[str, Any] = raw_flow if isinstance(raw_flow, dict) else {}
    refs = [("flow parent", ref) for ref in meta.get("parents") or []]
    refs += [("flow child", ref) for ref in (flow.get("children") or [])[:CHILDREN_SHOWN]]
    wanted = [(label, (str(r[0]), str(r[1])))
              for label, r in refs if isinstance(r, list) and len(r) == 2]  # fmt: skip
    if not wanted:
        return []
    match = Q()
    for _, (queue, job_id) in wanted:
        match |= Q(queue=queue, job_id=job_id)
    found = Job.objects.using(alias).filter(match).only("id", "queue", "job_id", "state")
    rows = {(r.queue, r.job_id): r for r in found}
    links = []
    for label, key in wanted:
        row = rows.get(key)
        text = f"{key[0]}/{key[1]}" + (f" ({row.state})" if row else " (not mirrored yet)")
        url = reverse("admin:django_jobq_job_change", args=[row.pk]) if row else ""
        links.append((label, text, url))
    return links


def _actions(
    request: HttpRequest, job: Job, live_state: JobState | None = None
) -> list[tuple[str, str, str]]:
    """(name, label, url) of each action allowed to this user and sensible in the job's
    state: the storage's state when it could be read (with Redis the row may trail it by the
    mirror's lag, and Cancel on a job Redis already completed would only be refused)."""
    state = live_state if live_state is not None else job.state
    out = []
    for name, spec in ACTIONS.items():
        if state in ACTION_STATES[name] and request.user.has_perm(spec.perm):
            url = reverse("admin:django_jobq_job_act", args=[job.pk, name])
            out.append((name, spec.label, url))
    return out
