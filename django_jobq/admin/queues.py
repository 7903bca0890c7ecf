"""The queue overview (the admin's "Queues" entry) and one page per queue with its charts.

State counts, the paused flag and dead letters come from the storage through the Queue API
(with Redis: a pipelined read of a few keys, fresher than the mirror); throughput, failure
rate and the oldest waiting job come from the job rows (indexed queries on finished_at and
(queue, state, created_at)).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from ..backend import get_storage
from ..errors import ValidationError as RefusedInput
from ..job import ms_to_datetime
from ..mirror import rollup
from ..models import Job
from ..states import JobState
from ..storage.database.operations import state_counts
from ..validation import logical_name
from . import controls, deadletters
from .charts import history_charts, queue_charts
from .common import (
    DELETE_PERM,
    LIVE_EVERY,
    QUEUE_CHANGE_PERM,
    RETRY_PERM,
    age,
    has_mirror,
    jobs_alias,
    live_rows,
    mirror_banner,
    queue_for,
    queue_names,
    rows_of,
)
from .workers import live_workers

#: Polling periods the queue pages accept (seconds); anything else means the default.
REFRESH_CHOICES = (5, 10, 30, 60)


def refresh_seconds(request: HttpRequest) -> int | None:
    """``?refresh=N`` polls the page's rows every N seconds instead of every ``LIVE_EVERY``
    (a slower wall display); only the offered values are accepted, so a link cannot make
    browsers hammer the server."""
    raw = request.GET.get("refresh", "")
    return int(raw) if raw.isdigit() and int(raw) in REFRESH_CHOICES else None


HOUR = dt.timedelta(hours=1)
NONE = rollup.Finished()  # a queue with no job finished in the hour
#: The states counted on each row, as the API's ``counts`` name them (dead letters, the
#: failed ones, have their own column). Completed and cancelled count the jobs still kept.
COUNTED = (
    JobState.QUEUED, JobState.SCHEDULED, JobState.ACTIVE, JobState.RETRYING,
    JobState.COMPLETED, JobState.CANCELLED,
)  # fmt: skip


def row_counts(names: list[str]) -> dict[str, dict[str, int]] | None:
    """With the database backend: each queue's rows per state, exact, from the triggers'
    counts (``StateCount``) in one read for every queue shown, a sharded queue's partitions
    summed. ``COUNT(*)`` visited every row of a state (100 ms and more per view on a
    million rows), so the overview stopped at 10,000 ("10000+") before. None: ask the
    storage (Redis, where counts are a few ZCARDs)."""
    if has_mirror():
        return None
    out: dict[str, dict[str, int]] = {name: {} for name in names}
    physical = {p: name for name in names for p in rows_of(name)}  # partitions: their queue
    for part, states in state_counts(jobs_alias(), list(physical)).items():
        counted = out[physical[part]]
        for state, n in states.items():
            counted[state.value] = counted.get(state.value, 0) + n
    return out


def queue_row(
    name: str, finished: rollup.Finished, workers: list[dict], now: dt.datetime,
    counted: dict[str, int] | None = None,
) -> dict:  # fmt: skip
    """One overview row; a queue whose storage read fails still gets a row, with the error."""
    row: dict[str, Any] = {"name": name, "error": None}
    try:
        queue = queue_for(name)
        if counted is None:
            live = queue.counts()
            counts = {state.value: live.get(state, 0) for state in COUNTED}
            dead = queue.count_dead()
        else:
            counts = {state.value: counted.get(state.value, 0) for state in COUNTED}
            dead = counted.get(JobState.FAILED.value, 0)
        row.update(counts=counts, paused=queue.is_paused(), dead=dead)
        row["failure_calls"] = queue.count_failure_calls()  # failure handler not done yet
    except Exception as exc:  # storage unreachable or a bad name: say so on the row
        row.update(counts={}, paused=None, dead=None, error=f"{type(exc).__name__}: {exc}")
    ended = finished.ended
    oldest = _oldest_waiting(name, row)
    row.update(
        completed_hour=finished.completed,
        failed_hour=finished.failed,
        per_minute=round(ended / 60, 2),
        failure_rate=round(100 * finished.failed / ended, 1) if ended else None,
        oldest_age=age(oldest, now) if oldest else None,
        workers=[w for w in workers if name in {logical_name(q) for q in w["queues"]}],
    )  # fmt: skip
    return row


class QueueAdmin(admin.ModelAdmin):
    """The QueueConfig model's admin entry opens the overview instead of a row list."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.overview_view), name="django_jobq_queueconfig_changelist"),
            path("q/<str:name>/", wrap(self.queue_view), name="django_jobq_queue_detail"),
            path(
                "all/<str:verb>/",
                wrap(self.pause_all_view),
                name="django_jobq_queue_pause_all",
            ),
            path(
                "q/<str:name>/settings/",
                wrap(self.settings_view),
                name="django_jobq_queue_settings",
            ),
            path(
                "q/<str:name>/dead/<str:verb>/",
                wrap(self.dead_view),
                name="django_jobq_queue_dead",
            ),
            path(
                "q/<str:name>/<str:verb>/",
                wrap(require_POST(self.pause_view)),
                name="django_jobq_queue_pause",
            ),
        ]

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "can_pause": request.user.has_perm(QUEUE_CHANGE_PERM),
            "can_retry": request.user.has_perm(RETRY_PERM),
            "can_purge": request.user.has_perm(DELETE_PERM),
            "live_every": refresh_seconds(request) or LIVE_EVERY,
        }

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        now = timezone.now()
        folded = rollup.fold(jobs_alias(), now)
        finished = rollup.finished_since(jobs_alias(), now - HOUR, folded.until)
        workers, workers_error = live_workers()
        names = queue_names()
        counted = row_counts(names)
        rows = [queue_row(n, finished.get(n, NONE), workers, now, _one(counted, n)) for n in names]
        context = {
            **self._context(request, "Queues"),
            "rows": rows,
            "workers_error": workers_error,
            "backend": type(get_storage()).__name__,
            "mirror_banner": mirror_banner(),
            "folded": folded,
        }
        rows_only = {
            "jobq-queues-body": "admin/django_jobq/queues/_overview_rows.html",
            "jobq-overview-notes": "admin/django_jobq/queues/_folding.html",
        }
        polled = live_rows(request, rows_only, context)
        if polled is not None:
            return polled
        return TemplateResponse(request, "admin/django_jobq/queues/overview.html", context)

    def queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """One queue's row, buttons and live charts; its poll (``?live=1``, jobq-live.js)
        gets the same parts rendered again, so the page follows the queue without a reload.
        The 30-day history (daily Spark rows) is drawn once, on the page itself."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if name not in queue_names():
            raise Http404(f"No queue {name!r}.")
        now = timezone.now()
        folded = rollup.fold(jobs_alias(), now)
        finished = rollup.finished_since(jobs_alias(), now - HOUR, folded.until).get(name, NONE)
        workers, workers_error = live_workers()
        context = {
            **self._context(request, f"Queue {name}"),
            "row": queue_row(name, finished, workers, now, _one(row_counts([name]), name)),
            "charts": queue_charts(jobs_alias(), name, now),
            "limits": _limits(name),
            "workers_error": workers_error,
            "folded": folded,
            "mirror_banner": mirror_banner(rows_of(name)),
        }
        parts = {
            "jobq-queue-body": "admin/django_jobq/queues/_detail_row.html",
            "jobq-queue-live": "admin/django_jobq/queues/_detail_live.html",
        }
        polled = live_rows(request, parts, context)
        if polled is not None:
            return polled
        context["history"] = history_charts(jobs_alias(), name, now)
        return TemplateResponse(request, "admin/django_jobq/queues/detail.html", context)

    def dead_view(self, request: HttpRequest, name: str, verb: str) -> HttpResponse:
        """Retry or purge every dead letter of a queue: a confirmation page (GET, or POST
        without ``confirm``) with their number, then the work and its summary."""
        if verb not in deadletters.VERBS:
            raise Http404(f"No such dead-letter action {verb!r}.")
        perm = RETRY_PERM if verb == "retry" else DELETE_PERM
        if not request.user.has_perm(perm):
            raise PermissionDenied
        if name not in queue_names():
            raise Http404(f"No queue {name!r}.")
        summary = None
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            since = request.POST.get("since", "")  # a run going on: its start (epoch ms)
            summary = deadletters.run(name, verb, since=int(since) if since.isdigit() else None)
            level = messages.WARNING if summary.error else messages.SUCCESS
            self.message_user(request, summary.text, level)
        try:
            # The database backend: the overview's count (the triggers'); counting the
            # dead-letter list itself visits every row (150 ms at 20,000 on PostgreSQL).
            counted = row_counts([name])
            dead: int | None = (
                queue_for(name).count_dead() if counted is None
                else counted[name].get(JobState.FAILED.value, 0)
            )  # fmt: skip
        except Exception:  # storage unreachable: the page says so
            dead = None
        label = "Retry all dead letters" if verb == "retry" else "Purge all dead letters"
        context = {
            **self._context(request, f"{label} of queue {name}"),
            "queue_name": name, "verb": verb, "label": label, "dead": dead,
            "summary": summary,
        }  # fmt: skip
        return TemplateResponse(request, "admin/django_jobq/queues/dead.html", context)

    def settings_view(self, request: HttpRequest, name: str) -> HttpResponse:
        return controls.settings_view(self, request, name)

    def pause_all_view(self, request: HttpRequest, verb: str) -> HttpResponse:
        if verb not in ("pause", "resume"):
            raise Http404(f"No such queue action {verb!r}.")
        return controls.pause_all_view(self, request, verb)

    def pause_view(self, request: HttpRequest, name: str, verb: str) -> HttpResponse:
        if not request.user.has_perm(QUEUE_CHANGE_PERM):
            raise PermissionDenied
        if verb not in ("pause", "resume"):
            raise Http404(f"No such queue action {verb!r}.")
        try:
            queue = queue_for(name)
            queue.pause() if verb == "pause" else queue.resume()
        except RefusedInput as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            done = "paused: workers take no new jobs" if verb == "pause" else "resumed"
            controls.audit(request, name, "Paused" if verb == "pause" else "Resumed")
            self.message_user(request, f"Queue {name} {done}.", messages.SUCCESS)
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
            back = reverse("admin:django_jobq_queueconfig_changelist")
        return HttpResponseRedirect(back)


def _oldest_waiting(name: str, row: dict[str, Any]) -> dt.datetime | None:
    """When the longest-waiting queued job became runnable, from where the row's counts come
    from (the storage with Redis, the rows with the database backend), so that it agrees with
    them: no waiting job next to a count of 0 queued."""
    if not row.get("counts", {}).get(JobState.QUEUED.value):
        return None
    storage = get_storage()
    physical = rows_of(name)
    if has_mirror() and hasattr(storage, "oldest_waiting_ms"):
        try:
            found = [ms for p in physical if (ms := storage.oldest_waiting_ms(p))]
        except Exception:  # Redis down: the row already shows the error
            return None
        return ms_to_datetime(min(found)) if found else None
    # min(coalesce(run_at, created_at)) as two index walks, (queue, state, run_at) and
    # (queue, state, created_at): the coalesce itself has no index and sorted every row.
    queued = Job.objects.using(jobs_alias()).filter(queue__in=physical, state=JobState.QUEUED)
    due = (
        queued.filter(run_at__isnull=False).order_by("run_at")
        .values_list("run_at", flat=True).first()
    )  # fmt: skip
    created = (
        queued.filter(run_at__isnull=True).order_by("created_at")
        .values_list("created_at", flat=True).first()
    )  # fmt: skip
    return min((t for t in (due, created) if t is not None), default=None)


def _one(counted: dict[str, dict[str, int]] | None, name: str) -> dict[str, int] | None:
    return None if counted is None else counted.get(name, {})


def _limits(name: str) -> dict[str, Any]:
    try:
        limits = queue_for(name).get_limits()
    except Exception:  # a storage without limits support or unreachable: show none
        return {}
    return {k: v for k, v in dataclasses.asdict(limits).items() if v is not None}
