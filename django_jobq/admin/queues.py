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
from django.db.models import Count
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from ..conf import get_storage
from ..errors import ValidationError as RefusedInput
from ..job import ms_to_datetime
from ..models import Job
from ..states import JobState
from .charts import finished_counts, history_charts, queue_charts
from .common import (
    QUEUE_CHANGE_PERM,
    age,
    has_mirror,
    jobs_alias,
    mirror_banner,
    queue_for,
    queue_names,
)
from .workers import live_workers

#: Auto-refresh periods offered on the queue pages (seconds); anything else means off.
REFRESH_CHOICES = (5, 10, 30, 60)


def refresh_seconds(request: HttpRequest) -> int | None:
    """``?refresh=N`` reloads the page every N seconds (a wall display of the queues); only
    the offered values are accepted, so a link cannot make browsers hammer the server."""
    raw = request.GET.get("refresh", "")
    return int(raw) if raw.isdigit() and int(raw) in REFRESH_CHOICES else None


COUNTED = (JobState.QUEUED, JobState.SCHEDULED, JobState.ACTIVE, JobState.RETRYING)


def row_counts(names: list[str]) -> dict[str, dict[str, int]] | None:
    """With the database backend the rows are the state: one grouped query over the states
    shown (the (queue, state, …) index skips the finished majority) beats a ``counts()`` per
    queue, which also counts every completed row. None: ask the storage (Redis)."""
    if has_mirror():
        return None
    out: dict[str, dict[str, int]] = {name: {} for name in names}
    rows = (
        Job.objects.using(jobs_alias())
        .filter(queue__in=names, state__in=[*COUNTED, JobState.FAILED])
        .values("queue", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        out.setdefault(row["queue"], {})[row["state"]] = row["n"]
    return out


def queue_row(
    name: str, finished: dict[str, int], workers: list[dict], now: dt.datetime,
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
    completed = finished.get(JobState.COMPLETED.value, 0)
    failed = finished.get(JobState.FAILED.value, 0)
    ended = completed + failed
    oldest = _oldest_waiting(name, row)
    row.update(
        completed_hour=completed,
        failed_hour=failed,
        per_minute=round(ended / 60, 2),
        failure_rate=round(100 * failed / ended, 1) if ended else None,
        oldest_age=age(oldest, now) if oldest else None,
        workers=[w for w in workers if name in w["queues"]],
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
            "refresh": refresh_seconds(request),
            "refresh_choices": REFRESH_CHOICES,
        }

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        now = timezone.now()
        finished = finished_counts(jobs_alias(), now - dt.timedelta(hours=1))
        workers, workers_error = live_workers()
        names = queue_names()
        counted = row_counts(names)
        rows = [
            queue_row(n, finished.get(n, {}), workers, now, None if counted is None else counted[n])
            for n in names
        ]
        context = {
            **self._context(request, "Queues"),
            "rows": rows,
            "workers_error": workers_error,
            "backend": type(get_storage()).__name__,
            "mirror_banner": mirror_banner(),
        }
        return TemplateResponse(request, "admin/django_jobq/queues/overview.html", context)

    def queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if name not in queue_names():
            raise Http404(f"No queue {name!r}.")
        now = timezone.now()
        finished = finished_counts(jobs_alias(), now - dt.timedelta(hours=1)).get(name, {})
        workers, workers_error = live_workers()
        context = {
            **self._context(request, f"Queue {name}"),
            "row": queue_row(name, finished, workers, now, _one(row_counts([name]), name)),
            "charts": queue_charts(jobs_alias(), name, now),
            "history": history_charts(jobs_alias(), name, now),
            "limits": _limits(name),
            "workers_error": workers_error,
        }
        return TemplateResponse(request, "admin/django_jobq/queues/detail.html", context)

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
    if has_mirror() and hasattr(storage, "oldest_waiting_ms"):
        try:
            return ms_to_datetime(storage.oldest_waiting_ms(name))
        except Exception:  # Redis down: the row already shows the error
            return None
    return (
        Job.objects.using(jobs_alias())
        .filter(queue=name, state=JobState.QUEUED)
        .annotate(since=Coalesce("run_at", "created_at"))
        .order_by("since")
        .values_list("since", flat=True)
        .first()
    )


def _one(counted: dict[str, dict[str, int]] | None, name: str) -> dict[str, int] | None:
    return None if counted is None else counted.get(name, {})


def _limits(name: str) -> dict[str, Any]:
    try:
        limits = queue_for(name).get_limits()
    except Exception:  # a storage without limits support or unreachable: show none
        return {}
    return {k: v for k, v in dataclasses.asdict(limits).items() if v is not None}
