"""Everything the job page shows about one job: its data, its outcome, its history, its
relatives, and the actions this user may take on it now."""

from __future__ import annotations

import copy
import math
from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse

from ..job import ms_to_datetime
from ..models import Job, Schedule
from ..serde import unwrap
from ..states import JobState
from ..storage.database.events import detail_data
from . import byhand
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
    # Not offered on the job page: on a failed job it is what Retry does (queued again,
    # attempts reset, out of the dead letters), and two buttons for one outcome make the
    # operator wonder which is right. The job list keeps it as a bulk action.
    "requeue_dead": set(),
    "delete": {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED},
    "run_now": {JobState.SCHEDULED, JobState.RETRYING},
    "priority": {JobState.QUEUED, JobState.SCHEDULED, JobState.RETRYING},
}


def context(request: HttpRequest, admin: Any, job: Job) -> dict[str, Any]:
    live, live_error = _live_status(job)
    payload, meta = unwrap(job.content_type, decode_blob(job.payload, job.content_type))
    state = str(live.state.value if live is not None else job.state)
    return {
        "state_label": state_label(job, state, meta),
        "title": f"Job {job.job_id}",
        "opts": admin.model._meta,
        "job": job,
        "live": live,
        "live_error": live_error,
        "mirror": has_mirror(),
        "payload": pretty(payload),
        "settings": {k: meta[k] for k in ("timeout", "hard_timeout") if k in meta},
        # A task function's job (@task): the name it is dispatched by, from the envelope, so
        # the database backend's rows (whose handler column names the queue's) show it too.
        "task": meta.get("task") if isinstance(meta.get("task"), str) else None,
        "result": _result(job),
        "error": job.error if isinstance(job.error, dict) else None,
        "traceback": error_traceback(job.error),
        "attempt_errors": attempt_errors(job),
        "progress": None if job.progress is None else pretty(job.progress),
        "progress_percent": _percent(progress_fraction(job.progress)),
        "live_url": reverse("admin:django_jobq_job_live", args=[job.pk]),
        **history(job),
        "timing": _timing(job),
        "due": due_at(job),
        "parked": is_parked(job),
        "related": related(job, meta),
        "actions": _actions(request, job, live.state if live is not None else None),
        "by_hand": byhand.tools(request, job, state, parked=is_parked(job)),
        "mirror_banner": mirror_banner([job.queue]),  # this job's queue only
    }


def error_traceback(error: Any) -> str | None:
    """The traceback worth a box of its own, or None: an error made without raising (a flow
    parent's ``ChildFailed``, a timeout) has a "traceback" of one line, its headline again."""
    if not isinstance(error, dict) or not isinstance(error.get("traceback"), str):
        return None
    text = error["traceback"].strip()
    if not text or "\n" not in text and text.endswith(str(error.get("message", ""))):
        return None
    return text


#: Events read for the attempts' errors (the newest; a job retried for days can have more).
ATTEMPT_EVENTS = 1000
#: The kinds that start, end or give back an attempt (progress and log lines are not read).
ATTEMPT_KINDS = ("active", "retrying", "failed", "completed", "cancelled", "stalled",
                 "released", "scheduled", "queued", "retried")  # fmt: skip
#: Kinds that end a running attempt without using it (its number is run again).
GIVEN_BACK = ("stalled", "released", "scheduled", "queued")


def attempt_errors(job: Job) -> dict[str, Any]:
    """Every failed attempt's error, newest first, from the job's events: the ``retrying``
    and ``failed`` events carry the error of the attempt they end (``Event.data``, kept in
    the event row's ``detail`` by both the database backend and the Redis mirror) unless it
    was over ``EVENT_DATA_MAX`` bytes; the newest one then comes from ``Job.error``. Attempts
    are numbered as the worker numbers them: an attempt given back (stalled, released) is run
    again under its number, and an operator's retry starts again from 1. ``gone`` says that
    older attempts' events are no longer there (trimmed before the mirror read them, a
    mirror re-read, or more than ``ATTEMPT_EVENTS``): their errors cannot be shown."""
    newest = (
        job.events.using(jobs_alias()).filter(kind__in=ATTEMPT_KINDS)
        .order_by("-at", "-id").only("kind", "at", "worker", "detail")[:ATTEMPT_EVENTS]
    )  # fmt: skip
    events = list(reversed(list(newest)))
    rows: list[dict[str, Any]] = []
    number, running, started, round_ = 0, False, None, 0
    for event in events:
        if event.kind == "retried":
            number, running, round_ = 0, False, round_ + 1
        elif event.kind == "active":
            number, running, started = number + 1, True, event.at
        elif running and event.kind in GIVEN_BACK:
            number, running = number - 1, False
            if event.kind == "stalled":
                rows.append(_attempt_row(job, event, number + 1, started, round_))
        elif event.kind in ("retrying", "failed"):
            rows.append(_attempt_row(job, event, number, started, round_))
            running = False
        elif event.kind in ("completed", "cancelled"):
            running = False
    # The current round's attempts the events do not account for came before the oldest
    # event read: number them on from there, and say that their errors are gone.
    missing = max(0, job.attempts - number)
    for row in rows:
        row["current"] = row.pop("round") == round_
        if row["current"]:
            row["attempt"] += missing
        elif missing:
            row["attempt"] = None  # a round before a retry whose start is gone: unknown
    rows.reverse()
    if _fill_newest(job, rows):
        missing = max(0, missing - 1)
    gone = bool(missing) or len(events) == ATTEMPT_EVENTS
    return {"rows": rows, "gone": gone, "missing": missing,
            "shown": len(rows) > 1 or gone and bool(rows or job.error)}  # fmt: skip


def _attempt_row(job: Job, event: Any, number: int, started: Any, round_: int) -> dict[str, Any]:
    error, omitted = detail_data(event.kind, event.detail)  # the events' own decoding
    ran = None
    if started is not None and event.at >= started:
        ran = duration((event.at - started).total_seconds() * 1000)
    return {"attempt": number, "round": round_, "at": event.at, "kind": event.kind,
            "worker": event.worker, "ran": ran, "error": error, "omitted": omitted,
            "traceback": error_traceback(error)}  # fmt: skip


def _fill_newest(job: Job, rows: list[dict[str, Any]]) -> bool:
    """The newest failed attempt's error from the row when its event could not carry it, or
    is gone: ``Job.error`` is that attempt's error while the job is retrying or failed.
    True when the row gave an attempt the events did not have."""
    if job.state not in (JobState.RETRYING, JobState.FAILED) or not isinstance(job.error, dict):
        return False
    kind = "failed" if job.state == JobState.FAILED else "retrying"
    if rows and rows[0]["attempt"] == job.attempts and rows[0]["kind"] == kind:
        if rows[0]["error"] is None:
            rows[0].update(error=job.error, omitted=False, traceback=error_traceback(job.error))
        return False
    at = job.finished_at or job.started_at or job.created_at
    rows.insert(0, {"attempt": job.attempts or None, "current": True, "at": at, "kind": kind,
                    "worker": job.worker, "ran": None, "error": job.error, "omitted": False,
                    "traceback": error_traceback(job.error)})  # fmt: skip
    return True


def progress_fraction(value: Any) -> float | None:
    """How far a job is, 0..1, from the progress shapes handlers report: a fraction
    (``0.4``), a percentage (``40``), or a mapping with a count and a total
    (``{"step": 20, "of": 60}``, ``{"done": 2, "total": 5}``); None for anything else
    (free-form status), which the page shows as text only."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
        if not math.isfinite(number) or number < 0:
            return None
        return min(1.0, number if number <= 1 else number / 100)
    if isinstance(value, dict):
        done = next((value[k] for k in DONE_KEYS if _number(value.get(k))), None)
        total = next((value[k] for k in TOTAL_KEYS if _number(value.get(k))), None)
        if done is not None and total:
            return max(0.0, min(1.0, float(done) / float(total)))
        percent = value.get("percent")
        if isinstance(percent, int | float) and _number(percent):
            return max(0.0, min(1.0, float(percent) / 100))
    return None


DONE_KEYS = ("step", "done", "current", "n", "completed", "count")
TOTAL_KEYS = ("of", "total", "steps", "max")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100, 1)


#: Event kinds a running job repeats many times: one summary row per attempt each.
CHATTY_KINDS = ("progress", "log")


def history(job: Job) -> dict[str, Any]:
    """The job's timeline and log lines, both by attempt and newest attempt first: a job
    retried five times shows its last try on top, not below the 300 lines of its first. An
    attempt starts at an "active" event; the log lines (which carry only their time) go to
    the attempt running at that time. Progress and log events collapse into one row per
    attempt (a job reporting every second would otherwise bury its transitions)."""
    newest = job.events.using(jobs_alias()).order_by("-at", "-id")[:TIMELINE_LIMIT]
    events = list(reversed(list(newest)))
    starts: list[Any] = [event.at for event in events if event.kind == "active"]
    rows: list[dict[str, Any]] = []
    attempt, started = 0, None
    if len(events) == TIMELINE_LIMIT:  # the oldest attempts fell off: count back from the last
        attempt = max(0, job.attempts - len(starts))
    chatty: dict[str, dict[str, Any]] = {}  # kind -> its summary row in this attempt
    for event in events:
        if event.kind == "active":
            attempt, started, chatty = attempt + 1, event.at, {}
        if event.kind in CHATTY_KINDS:
            row = chatty.get(event.kind)
            if row is None:
                row = chatty[event.kind] = {"kind": event.kind, "attempt": attempt, "count": 0,
                                            "first": event.at, "worker": event.worker}  # fmt: skip
                rows.append(row)
            row["count"] += 1
            row["at"] = event.at
            noun = "update" if event.kind == "progress" else "line"
            span = duration((event.at - row["first"]).total_seconds() * 1000)
            row["detail"] = f"{row['count']} {noun}{'s' if row['count'] > 1 else ''} over {span}"
            continue
        detail = _event_detail(job, event, attempt, started)
        rows.append({"kind": event.kind, "attempt": attempt, "at": event.at,
                     "worker": event.worker, "detail": detail})  # fmt: skip
    logs = [(ms_to_datetime(at), line) for at, line in (job.logs or [])]
    groups: list[dict[str, Any]] = []
    starts = [start for start in starts if start is not None]
    first_shown = max(0, job.attempts - len(starts)) if len(events) == TIMELINE_LIMIT else 0
    for number, (at, line) in enumerate(logs, 1):
        which = (sum(1 for start in starts if start <= at) + first_shown) or None
        if not groups or groups[-1]["attempt"] != which:
            groups.append({"attempt": which, "first": number, "lines": []})
        groups[-1]["lines"].append((number, at, line))
    return {"events": rows[::-1], "log_groups": groups[::-1], "logs": logs}


def _event_detail(job: Job, event: Any, attempt: int, started: Any) -> str:
    """What the DETAIL column says of one transition: the event's own detail when the storage
    gave one, else what the page knows (the attempt, how long it ran, the final error)."""
    carried = isinstance(event.detail, dict) and set(event.detail) <= {"raw", "ct", "omitted"}
    if event.detail not in (None, "", {}, []) and not carried:  # Event.data is not a detail
        return event.detail if isinstance(event.detail, str) else pretty(event.detail)
    if event.kind == "active":
        return f"attempt {attempt} of {job.max_attempts}"
    ran = ""
    if started is not None and attempt and event.kind in ("completed", "failed", "retrying"):
        ran = f"attempt {attempt} ran {duration((event.at - started).total_seconds() * 1000)}"
    return ran


def state_label(job: Job, state: str, meta: dict[str, Any] | None = None) -> str:
    """What the state badge says: the state, except for a flow parent parked until its
    children finish, which is "scheduled" only in the storage's terms (for the year 9000).
    ``meta`` is the job's envelope, read from the payload when not given."""
    if state != JobState.SCHEDULED or not is_parked(job):
        return state
    if meta is None:
        if "payload" in job.get_deferred_fields() or job.payload is None:  # the job list
            return "waiting for children"
        meta = unwrap(job.content_type, decode_blob(job.payload, job.content_type))[1]
    waiting = children_waiting(meta)
    if waiting is None:
        return "waiting for children"
    return f"waiting for {waiting} child{'' if waiting == 1 else 'ren'}"


def is_parked(job: Job) -> bool:
    return job.run_at is not None and job.run_at.year >= PARKED_YEAR


#: Children counted per query when a parent's page counts those still unfinished.
CHILD_CHUNK = 500


def children_waiting(meta: dict[str, Any]) -> int | None:
    """How many of a flow parent's children have not finished, from their rows (a child
    without a row yet counts as waiting); None when the envelope names no children."""
    flow = meta.get("flow")
    refs = flow.get("children") if isinstance(flow, dict) else None
    if not isinstance(refs, list) or not refs:
        return None
    keys = [(str(r[0]), str(r[1])) for r in refs if isinstance(r, list) and len(r) == 2]
    finished = 0
    alias = jobs_alias()
    for start in range(0, len(keys), CHILD_CHUNK):
        match = Q()
        for queue, job_id in keys[start : start + CHILD_CHUNK]:
            match |= Q(queue=queue, job_id=job_id)
        rows = Job.objects.using(alias).filter(match, state__in=FINISHED_STATES)
        finished += rows.count()
    return len(keys) - finished


def live(job: Job) -> dict[str, Any]:
    """What the job page updates in place (polled by jobq-live.js): the storage's current
    status, so that on Redis a running job's progress moves before the mirror writes it."""
    status, error = _live_status(job)
    if status is None:
        progress, state, attempts, worker = job.progress, job.state, job.attempts, job.worker
    else:
        progress, state = status.progress, status.state.value
        attempts, worker = status.attempts, status.worker
    return {
        "state": str(state),
        "label": state_label(job, str(state)),
        "attempts": attempts,
        "worker": worker or "",
        "progress": None if progress is None else pretty(progress),
        "percent": _percent(progress_fraction(progress)),
        "error": error,
        "finished": str(state) in FINISHED_STATES,
        "html": {"jobq-logs-box": live_logs(job, status)},
    }


def live_logs(job: Job, status: Any) -> str:
    """The log box as the page draws it, from the storage's lines when it answered (with
    Redis the row's lines trail by the mirror's lag): a running job's new lines appear on
    top without a reload."""
    if status is not None:
        job = copy.copy(job)
        job.logs = [[int(at.timestamp() * 1000), line] for at, line in status.logs]
    groups = history(job)["log_groups"]
    return render_to_string("admin/django_jobq/job/_logs.html", {"log_groups": groups})


FINISHED_STATES = {s.value for s in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)}


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


#: A flow parent waiting for its children is parked with a due time in year 9000 or later:
#: a marker, not a date to show or to count a wait from.
PARKED_YEAR = 9000


def due_at(job: Job) -> Any:
    """When the job is (was) due to run, or None: not set, or a parked flow parent."""
    if job.run_at is None or job.run_at.year >= PARKED_YEAR:
        return None
    return job.run_at


def _timing(job: Job) -> list[tuple[str, str]]:
    due = due_at(job)
    since = due if due and due > job.created_at else job.created_at
    if job.started_at and since > job.started_at:
        # Retried (or promoted) after it last started: its due time is the next run's, so
        # the wait of the attempt shown is counted from creation.
        since = job.created_at
    rows = []
    if job.started_at and job.started_at >= since:
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
