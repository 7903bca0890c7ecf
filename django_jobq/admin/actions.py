"""Operator actions on jobs: cancel, retry, requeue a dead letter, delete, run now, change
priority. Single (from a job's page) or bulk (from the list), always after a confirmation,
and always through the Queue API so Redis and the mirror agree; the outcome of each job is
reported, because "3 of 5 retried" is useless without knowing which 2 were not and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse

from ..errors import InvalidOption
from ..errors import ValidationError as RefusedInput
from ..models import Job
from ..states import JobState
from ..validation import validate_priority
from .common import CANCEL_PERM, CHANGE_PERM, DELETE_PERM, RETRY_PERM, has_mirror, queue_for

#: A bulk action acts on at most this many jobs per confirmation (each is one storage call).
MAX_BULK = 1000
#: List parameters that do not narrow the set: page, sort, the poll's flag, "show all".
NOT_FILTERS = ("p", "o", "live", "all", "_changelist_filters")


def filter_query(params: QueryDict) -> str:
    """The list's query string without what does not narrow it (page, sort, poll)."""
    query = params.copy()
    for key in NOT_FILTERS:
        query.pop(key, None)
    return query.urlencode()


def over_a_filter_url(name: str, params: QueryDict) -> str:
    """The page of an action over every job the list's filter matches (filtered.py)."""
    query = filter_query(params)
    url = reverse("admin:django_jobq_job_filter_action", args=[name])
    return f"{url}?{query}" if query else url


@dataclass(frozen=True)
class Outcome:
    job: Job
    ok: bool
    text: str


@dataclass(frozen=True)
class ActionSpec:
    label: str
    perm: str
    permission: str  # the ModelAdmin has_<permission>_permission hook
    run: Callable[[Job, dict[str, Any]], tuple[bool, str]]
    explain: str
    needs_priority: bool = False
    #: The states it can change, when it may run over a whole filter of the list (any
    #: number of jobs, filtered.py); empty: a selection only.
    over_a_filter: tuple[JobState, ...] = ()


def _cancel(job: Job, _: dict[str, Any], *, force: bool = False) -> tuple[bool, str]:
    outcome = queue_for(job.queue).cancel(job.job_id, force=force)
    if outcome.value == "requested":
        how = "kill" if force else "stop"
        return True, f"running: its worker was asked to {how} it (within about a second)"
    return outcome.value == "cancelled", outcome.value


def _force_cancel(job: Job, extra: dict[str, Any]) -> tuple[bool, str]:
    return _cancel(job, extra, force=True)


def _retry(job: Job, _: dict[str, Any]) -> tuple[bool, str]:
    outcome = queue_for(job.queue).retry(job.job_id)
    return outcome.value == "retried", outcome.value


def _requeue_dead(job: Job, _: dict[str, Any]) -> tuple[bool, str]:
    if job.state != JobState.FAILED:
        return False, f"not a dead letter ({job.state})"
    requeued = queue_for(job.queue).retry_dead([job.job_id])
    return bool(requeued), "requeued" if requeued else "no longer failed"


def _delete(job: Job, _: dict[str, Any]) -> tuple[bool, str]:
    if job.state not in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
        return False, f"kept: it is {job.state}; cancel it first, then delete it"
    deleted = queue_for(job.queue).delete([job.job_id])
    if deleted and has_mirror():
        # Queue.delete drops the mirror's rows of its own alias; this row may live elsewhere.
        Job.objects.using(job._state.db).filter(pk=job.pk).delete()
    return bool(deleted), "deleted" if deleted else "no longer finished"


def _run_now(job: Job, _: dict[str, Any]) -> tuple[bool, str]:
    outcome = queue_for(job.queue).promote(job.job_id)
    return outcome.value == "changed", "runs now" if outcome.value == "changed" else outcome.value


def _priority(job: Job, extra: dict[str, Any]) -> tuple[bool, str]:
    outcome = queue_for(job.queue).change_priority(job.job_id, extra["priority"])
    ok = outcome.value == "changed"
    return ok, f"priority {extra['priority']}" if ok else outcome.value


ACTIONS: dict[str, ActionSpec] = {
    "cancel": ActionSpec(
        "Cancel", CANCEL_PERM, "cancel", _cancel,
        "Waiting jobs are cancelled and never run; running jobs are asked to stop (their "
        "handler sees job.is_cancelled()) and end cancelled.",
        over_a_filter=(
            JobState.QUEUED, JobState.SCHEDULED, JobState.RETRYING, JobState.BLOCKED,
            JobState.ACTIVE,
        ),
    ),
    "force_cancel": ActionSpec(
        "Cancel and kill", CANCEL_PERM, "cancel", _force_cancel,
        "Running jobs are stopped by force where the pool can (process pool: the child is "
        "killed; async pool: the task is cancelled; thread pool: as a plain cancel).",
    ),
    "retry": ActionSpec(
        "Retry", RETRY_PERM, "retry", _retry,
        "Failed or cancelled jobs are queued again with attempts reset.",
        over_a_filter=(JobState.FAILED, JobState.CANCELLED),
    ),
    "requeue_dead": ActionSpec(
        "Requeue dead letter", RETRY_PERM, "retry", _requeue_dead,
        "Failed jobs leave the dead-letter list and are queued again.",
        over_a_filter=(JobState.FAILED,),
    ),
    "delete": ActionSpec(
        "Delete record", DELETE_PERM, "delete", _delete,
        "Finished jobs (completed, failed, cancelled) are deleted now instead of at their "
        "result TTL; their ids can be used again. Waiting and running jobs are kept.",
        over_a_filter=(JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
    ),
    "run_now": ActionSpec(
        "Run now", CHANGE_PERM, "change", _run_now,
        "Scheduled or retrying jobs become runnable at once.",
    ),
    "priority": ActionSpec(
        "Change priority", CHANGE_PERM, "change", _priority,
        "Waiting jobs get the new priority (lower runs first) and keep their place.",
        needs_priority=True,
    ),
}  # fmt: skip


def perform(name: str, jobs: Sequence[Job], extra: dict[str, Any]) -> list[Outcome]:
    """Run one action on each job; one job's error never stops the others."""
    spec = ACTIONS[name]
    outcomes = []
    for job in jobs:
        try:
            ok, text = spec.run(job, extra)
        except RefusedInput as exc:
            # Reserved rows of the database backend ("<id>~next") are bookkeeping, not jobs.
            ok, text = False, f"refused: {exc}"
        except Exception as exc:  # storage unreachable: report it against this job
            ok, text = False, f"error: {type(exc).__name__}: {exc}"
        outcomes.append(Outcome(job, ok, text))
    return outcomes


def parse_extra(spec: ActionSpec, data: Any) -> tuple[dict[str, Any], str | None]:
    """The action's own input (the new priority), validated at the edge."""
    if not spec.needs_priority:
        return {}, None
    raw = (data.get("priority") or "").strip()
    try:
        return {"priority": validate_priority(int(raw))}, None
    except (ValueError, InvalidOption) as exc:
        return {}, f"Priority must be a whole number: {exc}"


def confirm_page(
    request: HttpRequest, admin: Any, name: str, jobs: Sequence[Job], *, bulk: bool,
    error: str | None = None,
) -> TemplateResponse:  # fmt: skip
    spec = ACTIONS[name]
    context = {
        **admin.admin_site.each_context(request),
        "title": f"{spec.label}: are you sure?",
        "opts": admin.model._meta,
        "spec": spec,
        "action_name": name,
        "jobs": jobs,
        "bulk": bulk,
        "error": error,
        "priority": request.POST.get("priority", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/django_jobq/job/confirm.html", context)


def bulk_action(name: str) -> Callable[..., HttpResponse | None]:
    """A changelist action that asks for confirmation, then reports per job."""
    spec = ACTIONS[name]

    def action(admin: Any, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        across = request.POST.get("select_across") == "1"
        if across and spec.over_a_filter:
            # "Select all N jobs matching this filter": the run over the filter, any size,
            # chunked (filtered.py), from the list's own filters and search.
            return HttpResponseRedirect(over_a_filter_url(name, request.GET))
        jobs = list(queryset.defer("payload", "result", "logs", "progress")[: MAX_BULK + 1])
        if len(jobs) > MAX_BULK:
            wider = ", ".join(a.label for a in ACTIONS.values() if a.over_a_filter)
            admin.message_user(
                request,
                f"Select at most {MAX_BULK} jobs per action; {wider} can take every job "
                "matching the filter (tick all, then 'Select all … matching this filter').",
                messages.ERROR,
            )
            return None
        extra, error = parse_extra(spec, request.POST)
        if request.POST.get("confirm") != "yes" or error:
            shown_error = error if request.POST.get("confirm") == "yes" else None
            return confirm_page(request, admin, name, jobs, bulk=True, error=shown_error)
        outcomes = perform(name, jobs, extra)
        record(admin, request, spec, outcomes)
        return results_page(request, admin, spec, outcomes)

    action.__name__ = f"{name}_jobs"
    action.allowed_permissions = (spec.permission,)  # type: ignore[attr-defined]
    action.short_description = f"{spec.label} selected jobs"  # type: ignore[attr-defined]
    return action


def record(admin: Any, request: HttpRequest, spec: ActionSpec, outcomes: list[Outcome]) -> None:
    """Who did what to which job, in the admin's history (LogEntry), and a summary line."""
    for item in outcomes:
        admin.log_change(request, item.job, f"{spec.label}: {item.text}")
    done = sum(1 for item in outcomes if item.ok)
    level = messages.SUCCESS if done == len(outcomes) else messages.WARNING
    admin.message_user(request, f"{spec.label}: {done} of {len(outcomes)} job(s) done.", level)


def results_page(
    request: HttpRequest, admin: Any, spec: ActionSpec, outcomes: list[Outcome]
) -> TemplateResponse:
    context = {
        **admin.admin_site.each_context(request),
        "title": f"{spec.label}: what happened",
        "opts": admin.model._meta,
        "spec": spec,
        "outcomes": outcomes,
    }
    return TemplateResponse(request, "admin/django_jobq/job/results.html", context)
