"""The views of jobs by hand: the job form (add, duplicate), run again, reschedule, and the
page a new job is shown on. Each asks its permission (``permissions.py``: enqueue for a new
job, change for a due time), is a POST behind the admin's CSRF check where it changes
anything, and writes the admin's history (LogEntry); every change goes through the Queue API.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from ... import permissions as ops
from ...errors import ValidationError as RefusedInput
from ...job import EnqueueOutcome, EnqueueResult
from ...models import Job
from ...permissions import user_may
from ...queue.core import get_queue
from ...states import TERMINAL_STATES, JobState
from ...tasks.registry import registry
from ...validation import validate_job_id, validate_queue_name
from ..common import jobs_alias, queue_for, queue_names, rows_of
from .forms import LOCAL_FORMAT, JobForm, RescheduleForm, initial_from, job_copy


def may_enqueue(request: HttpRequest) -> bool:
    return user_may(request.user, ops.ENQUEUE)


def add_view(admin: Any, request: HttpRequest, source: Job | None = None) -> HttpResponse:
    """The job form: empty (``?queue=`` prefilled from a queue's page) or copied from
    ``source`` (Duplicate). A valid POST enqueues; an existing id is reported, not stored."""
    if not may_enqueue(request):
        raise PermissionDenied
    if request.method == "POST":
        form = JobForm(request.POST)
        if form.is_valid():
            spec = form.cleaned_data["spec"]
            queue = form.cleaned_data["queue"]
            try:
                result = get_queue(queue).enqueue(
                    spec["job_id"], spec["payload"], **spec["options"]
                )
            except Exception as exc:  # the storage did not answer: nothing was stored
                form.add_error(None, f"Not enqueued: {type(exc).__name__}: {exc}")
            else:
                done = _after_enqueue(admin, request, form, queue, result, source)
                if done is not None:
                    return done
    else:
        initial: dict[str, Any] = {}
        if source is not None:
            try:
                initial = initial_from(source)
            except ValueError as exc:
                admin.message_user(request, f"Cannot duplicate {source}: {exc}.", messages.ERROR)
                return HttpResponseRedirect(_page(source))
        elif request.GET.get("queue"):
            initial = {"queue": request.GET["queue"][:64]}
        form = JobForm(initial=initial)
    title = f"Duplicate job {source.job_id}" if source is not None else "Add job"
    context = {
        **admin.admin_site.each_context(request),
        "title": title,
        "opts": admin.model._meta,
        "form": form,
        "source": source,
        "queues": queue_names(),
        "tasks": [t.name for t in registry.tasks()],
        "zone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, "admin/django_jobq/job/form.html", context)


def _after_enqueue(
    admin: Any,
    request: HttpRequest,
    form: JobForm,
    queue: str,
    result: EnqueueResult,
    source: Job | None,
) -> HttpResponse | None:
    """Stored: audit, say so and show the new job. An existing id: the form says so with a
    link to that job (None: the form is shown again)."""
    if result.outcome in (EnqueueOutcome.DUPLICATE, EnqueueOutcome.COMPLETED):
        link = format_html(
            '<a href="{}" id="jobq-existing">{}</a>',
            created_url(queue, result.job_id),
            f"{queue}/{result.job_id}",
        )
        form.add_error(
            "job_id",
            format_html(
                "A job with this id exists already ({}, {}): nothing was enqueued.",
                link,
                result.state.value,
            ),
        )
        return None
    how = f" from {source.queue}/{source.job_id}" if source is not None else ""
    audit_new(request, queue, result.job_id, f"Enqueued by hand{how}: {result.outcome.value}")
    if source is not None:
        admin.log_change(request, source, f"Duplicated as {queue}/{result.job_id}")
    announce(admin, request, queue, result)
    return HttpResponseRedirect(created_url(queue, result.job_id))


def run_again_view(admin: Any, request: HttpRequest, job: Job) -> HttpResponse:
    """POST: a new job with the finished ``job``'s queue, handler, payload and options."""
    if not may_enqueue(request):
        raise PermissionDenied
    if request.method != "POST":
        return HttpResponseRedirect(_page(job))
    status = _live_state(job)
    if status not in TERMINAL_STATES:
        admin.message_user(
            request,
            f"{job.queue}/{job.job_id} is {status}: only a finished job can be run again.",
            messages.WARNING,
        )
        return HttpResponseRedirect(_page(job))
    try:
        copy = job_copy(job)
        options = dict(copy["options"])
        if copy["task"]:
            options["meta"] = {"task": copy["task"]}
        result = get_queue(copy["queue"]).enqueue(None, copy["payload"], **options)
    except Exception as exc:  # a payload that no longer decodes, a refused option, storage down
        admin.message_user(request, f"Not run again: {type(exc).__name__}: {exc}", messages.ERROR)
        return HttpResponseRedirect(_page(job))
    audit_new(
        request,
        copy["queue"],
        result.job_id,
        f"Run again of {job.queue}/{job.job_id}: {result.outcome.value}",
    )
    admin.log_change(request, job, f"Run again as {copy['queue']}/{result.job_id}")
    announce(admin, request, copy["queue"], result)
    return HttpResponseRedirect(created_url(copy["queue"], result.job_id))


def reschedule_view(admin: Any, request: HttpRequest, job: Job) -> HttpResponse:
    """POST ``run_at`` (admin's time zone): the waiting job's new due time; a time already
    past makes it run now (``Queue.promote``)."""
    if not user_may(request.user, ops.CHANGE):
        raise PermissionDenied
    if request.method != "POST":
        return HttpResponseRedirect(_page(job))
    form = RescheduleForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(str(e) for field in form.errors.values() for e in field)
        admin.message_user(request, f"Not rescheduled: {errors}", messages.ERROR)
        return HttpResponseRedirect(_page(job))
    when = form.cleaned_data["run_at"]
    try:
        queue = queue_for(job.queue)
        now = when <= timezone.now()
        outcome = queue.promote(job.job_id) if now else queue.change_run_at(job.job_id, when)
    except Exception as exc:  # storage unreachable or a reserved row's id
        admin.message_user(request, f"Not rescheduled: {type(exc).__name__}: {exc}", messages.ERROR)
        return HttpResponseRedirect(_page(job))
    shown = "now" if now else timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S %Z")
    ok = outcome.value == "changed"
    text = f"Reschedule to {shown}: {'done' if ok else outcome.value}"
    admin.log_change(request, job, text)
    admin.message_user(
        request, f"{job.queue}/{job.job_id}: {text}", messages.SUCCESS if ok else messages.WARNING
    )
    return HttpResponseRedirect(_page(job))


def created_view(admin: Any, request: HttpRequest) -> HttpResponse:
    """Where a new job is shown: its page once its row exists (at once with the database
    backend; with Redis when the mirror wrote it), until then what the storage says."""
    if not admin.has_view_or_change_permission(request):
        raise PermissionDenied
    try:
        queue = validate_queue_name(request.GET.get("queue", ""))
        job_id = validate_job_id(request.GET.get("id", ""))
    except RefusedInput as exc:
        raise Http404(str(exc)) from None
    row = _row(queue, job_id)
    if row is not None:
        return HttpResponseRedirect(_page(row))
    try:
        status, error = get_queue(queue).get_status(job_id), None
    except Exception as exc:  # storage unreachable: the page says so
        status, error = None, f"{type(exc).__name__}: {exc}"
    context = {
        **admin.admin_site.each_context(request),
        "title": f"Job {job_id}",
        "opts": admin.model._meta,
        "queue_name": queue,
        "job_id": job_id,
        "status": status,
        "error": error,
    }
    return TemplateResponse(request, "admin/django_jobq/job/created.html", context)


# -- helpers ---------------------------------------------------------------------------------


def tools(request: HttpRequest, job: Job, state: str, *, parked: bool) -> dict[str, Any]:
    """What the job page's "by hand" box offers this user for ``job`` in ``state`` (the
    storage's when known)."""
    finished = state in TERMINAL_STATES
    waiting = state in (JobState.QUEUED, JobState.SCHEDULED, JobState.RETRYING) and not parked
    due = job.run_at if job.run_at and not parked else None
    return {
        "again": finished and may_enqueue(request) and "~" not in job.job_id,
        "duplicate": may_enqueue(request) and "~" not in job.job_id,
        "reschedule": waiting and user_may(request.user, ops.CHANGE),
        "due_local": timezone.localtime(due).strftime(LOCAL_FORMAT) if due else "",
        "zone": timezone.get_current_timezone_name(),
    }


def announce(admin: Any, request: HttpRequest, queue: str, result: EnqueueResult) -> None:
    pending = (
        " (journal: sent to Redis shortly)" if result.outcome is EnqueueOutcome.PENDING else ""
    )
    admin.message_user(
        request,
        format_html(
            'Enqueued job <a href="{}" id="jobq-new-job">{}</a> in queue {}: {}{}.',
            created_url(queue, result.job_id),
            result.job_id,
            queue,
            result.state.value,
            pending,
        ),
        messages.SUCCESS,
    )


def audit_new(request: HttpRequest, queue: str, job_id: str, message: str) -> None:
    """A new job in the admin's history: against its row when it has one already (database
    backend), else by name (with Redis the mirror writes the row a moment later)."""
    row = _row(queue, job_id)
    LogEntry.objects.create(
        user_id=cast(Any, request.user.pk),  # logged in: admin_view
        content_type=ContentType.objects.get_for_model(Job),
        object_id=str(row.pk) if row is not None else None,
        object_repr=f"{queue}/{job_id}"[:200],
        action_flag=ADDITION,
        change_message=message,
    )


def created_url(queue: str, job_id: str) -> str:
    query = urlencode({"queue": queue, "id": job_id})
    return f"{reverse('admin:django_jobq_job_byhand_created')}?{query}"


def _row(queue: str, job_id: str) -> Job | None:
    return (
        Job.objects.using(jobs_alias())
        .filter(queue__in=rows_of(queue), job_id=job_id)
        .only("pk", "queue", "job_id", "state")
        .first()
    )


def _page(job: Job) -> str:
    return reverse("admin:django_jobq_job_change", args=[job.pk])


def _live_state(job: Job) -> str:
    try:
        status = queue_for(job.queue).get_status(job.job_id)
    except Exception:  # storage unreachable: the row's state decides, the enqueue then fails
        return str(job.state)
    return str(job.state) if status is None else status.state.value
