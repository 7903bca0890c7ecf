"""The job list and the job page.

Rows are read from ``jobs_alias()`` (the backend's tables or the mirror); every change goes
through the Queue API (``actions.py``). The stock change form is replaced by a read-only job
page: a job's fields are the storage's to change, never a form's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import options as admin_options
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.timezone import localtime

from .. import permissions as ops
from ..models import Job
from ..permissions import user_may
from ..states import JobState
from . import detail
from .actions import ACTIONS, bulk_action, confirm_page, parse_extra, perform, record
from .common import duration, jobs_alias, mirror_banner, queue_names
from .listing import (
    STATE_COLORS,
    CreatedWithinFilter,
    EstimatedCountPaginator,
    HandlerFilter,
    JobChangeList,
    QueueFilter,
    WorkerFilter,
)

# Django 6.1+; None on 6.0 (see get_actions).
ActionLocation: Any = getattr(admin_options, "ActionLocation", None)
HEAVY_FIELDS = ("payload", "result", "error", "logs", "progress")


def _when(value: dt.datetime | None) -> str:
    """Compact local time (the list has many columns; the job page shows full dates)."""
    if value is None:
        return "—"
    return format_html('<span class="jobq-nowrap">{}</span>', f"{localtime(value):%m-%d %H:%M:%S}")


def state_badge(state: str) -> str:
    css = STATE_COLORS.get(JobState(state), "queued") if state in JobState.values else "queued"
    return format_html('<span class="jobq-state jobq-state-{}">{}</span>', css, state)


class JobAdmin(admin.ModelAdmin):
    list_display = (
        "job_link", "queue", "state_label", "handler", "tries", "priority", "worker",
        "created", "finished", "run_time",
    )  # fmt: skip
    list_display_links = None
    list_filter = (
        QueueFilter, "state", HandlerFilter, WorkerFilter, CreatedWithinFilter,
        ("finished_at", admin.DateFieldListFilter),
    )  # fmt: skip
    # See get_search_results: an exact id through the (queue, job_id) index, else a handler.
    search_fields = ("job_id", "handler")
    search_help_text = "An exact job id, or the beginning of a handler name."
    # By primary key: rows are inserted in creation order, and it is the one index every
    # sort can use on a million rows (``-created_at`` has no index of its own).
    ordering = ("-id",)
    list_per_page = 100
    list_max_show_all = 500
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = tuple(bulk_action(name) for name in ACTIONS)
    change_list_template = "admin/django_jobq/job/change_list.html"

    # -- what is visible, and to whom ------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).using(jobs_alias()).defer(*HEAVY_FIELDS)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """An exact job id first, looked up through the (queue, job_id) unique index with the
        known queue names (a pasted id costs a few index probes, not a scan of every row);
        only when no job has that id, the handlers starting with the term."""
        term = search_term.strip()
        if not term:
            return queryset, False
        by_id = queryset.filter(queue__in=queue_names(), job_id=term)
        if by_id.exists():
            return by_id, False
        return queryset.filter(handler__startswith=term), False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[JobChangeList]:
        return JobChangeList

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (and warns about overrides without the
        # argument); 6.0 has no such argument.
        if ActionLocation is None:
            actions = super().get_actions(request)
        else:
            where = action_location or ActionLocation.CHANGE_LIST
            actions = super().get_actions(request, where)  # type: ignore[call-arg,unused-ignore]
        # The stock bulk delete removes rows behind the storage's back.
        actions.pop("delete_selected", None)
        return actions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code, through the Queue API

    def has_cancel_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return user_may(request.user, ops.CANCEL)

    def has_retry_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return user_may(request.user, ops.RETRY)

    # -- columns ---------------------------------------------------------------------------

    @admin.display(description="job id", ordering="job_id")
    def job_link(self, obj: Job) -> str:
        url = reverse("admin:django_jobq_job_change", args=[obj.pk])
        return format_html('<a href="{}" class="jobq-id">{}</a>', url, obj.job_id)

    @admin.display(description="state", ordering="state")
    def state_label(self, obj: Job) -> str:
        return state_badge(obj.state)

    @admin.display(description="attempts")
    def tries(self, obj: Job) -> str:
        stalls = f" · {obj.stalls} stalled" if obj.stalls else ""
        return f"{obj.attempts}/{obj.max_attempts}{stalls}"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Job) -> str:
        return _when(obj.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: Job) -> str:
        return _when(obj.finished_at)

    @admin.display(description="run time")
    def run_time(self, obj: Job) -> str:
        if obj.started_at and obj.finished_at:
            return duration((obj.finished_at - obj.started_at).total_seconds() * 1000)
        return "—"

    # -- the job page and single-job actions -----------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/act/<str:name>/",
                self.admin_site.admin_view(self.act_view),
                name="django_jobq_job_act",
            )
        ]
        return own + super().get_urls()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "mirror_banner": mirror_banner()}
        return super().changelist_view(request, context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:  # fmt: skip
        job = self._job_or_404(request, object_id)
        if not self.has_view_or_change_permission(request, job):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **detail.context(request, self, job),
        }
        return TemplateResponse(request, "admin/django_jobq/job/detail.html", context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Deleting goes through the Queue API (purge of a dead letter), never a raw DELETE.
        return HttpResponseRedirect(
            reverse("admin:django_jobq_job_act", args=[object_id, "delete"])
        )

    def act_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        spec = ACTIONS.get(name)
        job = self._job_or_404(request, object_id)
        if spec is None or not request.user.has_perm(spec.perm):
            raise PermissionDenied
        extra, error = parse_extra(spec, request.POST)
        if request.method != "POST" or request.POST.get("confirm") != "yes" or error:
            shown = error if request.method == "POST" else None
            return confirm_page(request, self, name, [job], bulk=False, error=shown)
        outcomes = perform(name, [job], extra)
        record(self, request, spec, outcomes)
        level = messages.SUCCESS if outcomes[0].ok else messages.WARNING
        self.message_user(request, f"{job.queue}/{job.job_id}: {outcomes[0].text}", level)
        if not Job.objects.using(jobs_alias()).filter(pk=job.pk).exists():
            return HttpResponseRedirect(reverse("admin:django_jobq_job_changelist"))
        return HttpResponseRedirect(reverse("admin:django_jobq_job_change", args=[job.pk]))

    def _job_or_404(self, request: HttpRequest, object_id: str) -> Job:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if not object_id.isdigit():
            raise Http404("No such job row.")
        return get_object_or_404(Job.objects.using(jobs_alias()), pk=int(object_id))
