"""The job list and the job page.

Rows are read from ``jobs_alias()`` (the backend's tables or the mirror); every change goes
through the Queue API (``actions.py``). The stock change form is replaced by a read-only job
page: a job's fields are the storage's to change, never a form's.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import options as admin_options
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template import RequestContext, Template
from django.template.response import TemplateResponse
from django.urls import URLPattern, get_script_prefix, get_urlconf, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime

from .. import permissions as ops
from ..models import Job
from ..permissions import user_may
from ..states import JobState
from . import detail, filtered, search
from .actions import ACTIONS, bulk_action, confirm_page, parse_extra, perform, record
from .common import duration, jobs_alias, mirror_banner, physical_queue_names, rows_of
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
HEAVY_FIELDS = ("payload", "result", "error", "logs")  # progress is small: the list shows it


def _when(value: dt.datetime | None) -> str:
    """Local time in the job page's format (YYYY-MM-DD HH:MM:SS); narrow columns wrap the
    time under the date."""
    if value is None:
        return "—"
    local = localtime(value)
    # Digits, dashes and colons only: nothing to escape (format_html's escaping of three
    # values is a tenth of the list's CPU time at 200 cells a page).
    return mark_safe(  # noqa: S308
        f'<time datetime="{value.isoformat()}" class="jobq-when"><span>{local:%Y-%m-%d}</span>'
        f" <span>{local:%H:%M:%S}</span></time>"
    )


@functools.lru_cache(maxsize=16)
def _change_url(prefix: str, urlconf: str | None) -> str:
    """A job page's URL with row 0, per script prefix and URLconf: one ``reverse`` instead
    of one per row of the list."""
    return reverse("admin:django_jobq_job_change", args=[0])


def id_prefix(queryset: QuerySet[Job], term: str) -> QuerySet[Job]:
    """Jobs whose id starts with ``term``, through an index. PostgreSQL: the (queue, job_id)
    unique index, ``varchar_pattern_ops`` on job_id since migration 0022, serves
    ``LIKE 'term%'`` whatever the collation. Elsewhere (SQLite compares text as bytes, in code
    point order) a range of the (queue, job_id) unique index narrows the rows and the LIKE
    keeps the case exact."""
    return starting_with(queryset, "job_id", term)


def starting_with(queryset: QuerySet[Job], field: str, term: str) -> QuerySet[Job]:
    """Rows whose ``field`` starts with ``term``: ``LIKE 'term%'`` (PostgreSQL reads a
    ``varchar_pattern_ops`` index for it), plus elsewhere the range ``term <= field <
    next(term)`` an ordinary index serves (SQLite compares text in code point order; its
    LIKE, case-insensitive, reads no index)."""
    matching = queryset.filter(**{f"{field}__startswith": term})
    if connections[queryset.db].vendor == "postgresql":
        return matching
    last = ord(term[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are no characters: next is U+E000
        last = 0xE000
    if last > 0x10FFFF:
        return matching.filter(**{f"{field}__gte": term})
    return matching.filter(**{f"{field}__gte": term, f"{field}__lt": term[:-1] + chr(last)})


def state_badge(state: str) -> str:
    css = STATE_COLORS.get(JobState(state), "queued") if state in JobState.values else "queued"
    return format_html('<span class="jobq-state jobq-state-{}">{}</span>', css, state)


class JobAdmin(admin.ModelAdmin):
    list_display = (
        "job_link", "queue", "state_label", "progress_bar", "handler_name", "tries", "priority",
        "worker", "created", "finished", "run_time",
    )  # fmt: skip
    list_display_links = None
    list_filter = (
        QueueFilter, "state", HandlerFilter, WorkerFilter, CreatedWithinFilter,
        ("finished_at", admin.DateFieldListFilter),
    )  # fmt: skip
    # See get_search_results: an exact id through the (queue, job_id) index, else a handler.
    search_fields = ("job_id", "handler")
    search_help_text = (
        "A job id or its beginning, or the beginning of a handler name; with “search in” "
        "payload or error, any part of a job's arguments or of its error (type, message, "
        "traceback)."
    )
    # Newest first by creation time, the primary key breaking ties: every common view has an
    # index in that order ((created_at, id) alone; (queue, created_at, id); and, SQLite
    # appending the row id to every index, (queue, state, created_at)). By the primary key
    # alone, a queue-and-state filter sorted every matching row on SQLite (20,000 for one
    # queue's waiting jobs here: 30 ms idle, 200 ms under load).
    ordering = ("-created_at", "-id")
    list_per_page = 100
    list_max_show_all = 500
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # "Show counts" (facets) counts every filter choice over the whole filtered table: about a
    # second per view on a million rows. The queue pages show the live counts instead.
    show_facets = admin.ShowFacets.NEVER
    actions = tuple(bulk_action(name) for name in ACTIONS)
    change_list_template = "admin/django_jobq/job/change_list.html"

    # -- what is visible, and to whom ------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).using(jobs_alias()).defer(*HEAVY_FIELDS)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """By default an exact job id first, then job ids starting with the term, then
        handlers starting with it, each through an index: ids per known queue name on
        (queue, job_id) (a pasted id or a prefix costs a few index probes, never a scan of
        every row), handlers on (handler, created_at, id) (migration 0029). With "search in"
        payload or error: the text search of ``search.py``. What the page should tell about
        the search (a term cut, jobs not searched) goes to ``request.jobq_search_note``."""
        term, notes = search.clean_term(search_term)
        where = request.GET.get(search.SEARCH_IN_VAR, "")
        if where not in search.SEARCH_IN:
            notes.append(f"There is no “search in {where[:40]}”: ids and handlers were searched.")
            where = ""
        request.jobq_search_note = " ".join(notes) or None  # type: ignore[attr-defined]
        if not term:
            return queryset, False
        if where:
            found, note = search.text_search(queryset, where, term)
            request.jobq_search_note = " ".join([*notes, note] if note else notes) or None  # type: ignore[attr-defined]
            return found, False
        names = physical_queue_names()
        by_id = queryset.filter(queue__in=names, job_id=term)
        if by_id.exists():
            return by_id, False
        by_prefix = id_prefix(queryset.filter(queue__in=names), term)
        if by_prefix.exists():
            return by_prefix, False
        return starting_with(queryset, "handler", term), False

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

    def action_checkbox(self, obj: Job) -> SafeString:
        """The row's tick box, as Django's own but without a form widget rendered through
        the template engine for each row (a third of the list's CPU time on 100 rows)."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" '
            'aria-label="Select this object for an action - {}">',
            ACTION_CHECKBOX_NAME, obj.pk, str(obj),
        )  # fmt: skip

    @admin.display(description="job id", ordering="job_id")
    def job_link(self, obj: Job) -> str:
        url = _change_url(get_script_prefix(), get_urlconf()).removesuffix("0/change/")
        url = f"{url}{int(obj.pk)}/change/"
        # Long ids are cut with an ellipsis (the table fits its box at 1280 px with the menu
        # open); the whole id is the link's title.
        return format_html(
            '<a href="{}" class="jobq-id jobq-trunc" title="{}">{}</a>', url, obj.job_id, obj.job_id
        )

    @admin.display(description="handler", ordering="handler")
    def handler_name(self, obj: Job) -> str:
        if not obj.handler:
            return "—"
        return format_html(
            '<span class="jobq-trunc" title="{}">{}</span>', obj.handler, obj.handler
        )

    @admin.display(description="state", ordering="state")
    def state_label(self, obj: Job) -> str:
        label = detail.state_label(obj, obj.state)  # a parked flow parent: not "scheduled"
        if label != obj.state:
            return format_html('<span class="jobq-state jobq-state-blocked">{}</span>', label)
        return state_badge(obj.state)

    @admin.display(description="done")
    def progress_bar(self, obj: Job) -> str:
        fraction = detail.progress_fraction(obj.progress)
        if fraction is None:
            return "—" if obj.progress is None else "…"
        percent = round(fraction * 100)
        return format_html(
            '<span class="jobq-mini-bar" title="{}%"><span style="width: {}%"></span></span>',
            percent, percent,
        )  # fmt: skip

    @admin.display(description="tries")
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
                "filter/<str:name>/",
                self.admin_site.admin_view(self.filter_action_view),
                name="django_jobq_job_filter_action",
            ),
            path(
                "<path:object_id>/live/",
                self.admin_site.admin_view(self.live_view),
                name="django_jobq_job_live",
            ),
            path(
                "q/<str:queue>/<path:job_id>/",
                self.admin_site.admin_view(self.by_id_view),
                name="django_jobq_job_by_id",
            ),
            path(
                "<path:object_id>/act/<str:name>/",
                self.admin_site.admin_view(self.act_view),
                name="django_jobq_job_act",
            ),
        ]
        from . import byhand  # jobs by hand: the job form, run again, reschedule, promote all

        return own + byhand.urls(self) + super().get_urls()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A list filtered to a queue warns about that queue only.
        shown = request.GET.get("queue")
        banner = mirror_banner(rows_of(shown) if shown else None)
        context = {**(extra_context or {}), "mirror_banner": banner, "title": "Jobs"}
        if request.GET.get("live") != "1":
            return super().changelist_view(request, context)
        # The page's poll (jobq-live.js): the same list (filters, search, page) without the
        # poll's own parameter, which the change list would take for an unknown filter.
        query = request.GET.copy()
        query.pop("live")
        query._mutable = False
        request.GET = query  # type: ignore[assignment]
        response = super().changelist_view(request, context)
        if not isinstance(response, TemplateResponse) or response.context_data is None:
            return response  # a redirect (a filter that no longer applies): the page reloads
        table = Template("{% load admin_list %}{% result_list cl %}").render(
            RequestContext(request, response.context_data)
        )
        return JsonResponse({"html": {"jobq-results-box": table}},
                            headers={"Cache-Control": "no-store"})  # fmt: skip

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:  # fmt: skip
        if not object_id.isdigit() and self.has_view_or_change_permission(request):
            return self._by_job_id(object_id)
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

    def filter_action_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """An action over every job of a filter of the list (``filtered.py``)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return filtered.view(self, request, name)

    def live_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The job page's live figures as JSON (state, progress, attempts), polled by
        jobq-live.js every few seconds while the page is open."""
        job = self._job_or_404(request, object_id)
        if not self.has_view_or_change_permission(request, job):
            raise PermissionDenied
        return JsonResponse(detail.live(job), headers={"Cache-Control": "no-store"})

    def by_id_view(self, request: HttpRequest, queue: str, job_id: str) -> HttpResponse:
        """A stable link to a job by what the application knows (queue and job id); the
        page itself lives at the row's primary key, which differs between databases and
        changes when the mirror rebuilds its rows."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        pk = (
            Job.objects.using(jobs_alias())
            .filter(queue__in=rows_of(queue), job_id=job_id)
            .values_list("pk", flat=True)
            .first()
        )
        if pk is None:
            raise Http404(f"No job {job_id!r} in queue {queue!r} (it may have expired).")
        return HttpResponseRedirect(reverse("admin:django_jobq_job_change", args=[pk]))

    def _by_job_id(self, job_id: str) -> HttpResponse:
        """``job/<job id>/change/`` (a job id pasted where the row id goes): the job's page
        when one queue has that id, the list of them when several do."""
        pks = list(
            Job.objects.using(jobs_alias())
            .filter(queue__in=physical_queue_names(), job_id=job_id)
            .values_list("pk", flat=True)[:2]
        )
        if not pks:
            raise Http404(f"No job row {job_id!r} and no job with that id.")
        if len(pks) == 1:
            return HttpResponseRedirect(reverse("admin:django_jobq_job_change", args=[pks[0]]))
        query = urlencode({"q": job_id})
        return HttpResponseRedirect(f"{reverse('admin:django_jobq_job_changelist')}?{query}")

    def _job_or_404(self, request: HttpRequest, object_id: str) -> Job:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if not object_id.isdigit():
            raise Http404("No such job row.")
        return get_object_or_404(Job.objects.using(jobs_alias()), pk=int(object_id))
