"""The workers page (the admin's "Workers" entry): live workers from the storage's registry,
not from the mirror, so a worker that died a second ago shows as stale now.

A worker re-registers on every heartbeat (a third of its lease); its registration expires
after three heartbeats. Missing two heartbeats marks it stale: alive on paper, probably stuck
or partitioned. Rows of the WorkerInfo table that the registry no longer lists (a worker
killed without deregistering, database backend) are shown as gone until they are cleaned up.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from ..backend import get_storage
from ..conf import jobq_settings
from ..job import ms_to_datetime
from ..models import Job, WorkerInfo
from ..states import JobState
from .common import LIVE_EVERY, age, jobs_alias, live_rows

#: Current jobs listed per worker (a worker with concurrency 500 would flood the page).
CURRENT_JOBS_SHOWN = 20


def heartbeat_seconds() -> float:
    return float(jobq_settings()["WORKER"]["lease"]) / 3000


def live_workers(now: dt.datetime | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Registered workers as dicts for the templates, and the error if the storage failed."""
    now = now or timezone.now()
    try:
        records = get_storage().list_workers()
    except Exception as exc:  # storage unreachable: the page says so instead of failing
        return [], f"{type(exc).__name__}: {exc}"
    stale_after = dt.timedelta(seconds=2 * heartbeat_seconds())
    out = []
    for rec in records:
        info = rec.info
        seen = ms_to_datetime(rec.last_seen)
        out.append({
            "worker_id": rec.worker_id,
            "host": info.get("host", ""),
            "pid": info.get("pid"),
            "queues": list(info.get("queues", [])),
            "groups": [g.split(":", 1) for g in info.get("groups", []) if ":" in g],
            "concurrency": info.get("concurrency", 0),
            "pool": info.get("pool", ""),
            "autoscale": _autoscale(info.get("autoscale")),
            "in_flight": info.get("in_flight", 0),
            "completed": info.get("completed", 0),
            "failed": info.get("failed", 0),
            "started": ms_to_datetime(info.get("started")),
            "last_seen": seen,
            "last_seen_age": age(seen, now),
            "stale": seen is None or now - seen > stale_after,
            "gone": False,
        })  # fmt: skip
    return sorted(out, key=lambda w: w["worker_id"]), None


def _autoscale(last: Any) -> str:
    """The autoscaler's last decision (``runworker --autoscale``) in one line."""
    if not isinstance(last, dict):
        return ""
    return f"autoscale {last.get('min')}–{last.get('max')}: {last.get('reason', '')}"


def gone_workers(live_ids: set[str], now: dt.datetime) -> list[dict[str, Any]]:
    rows = WorkerInfo.objects.using(jobs_alias()).exclude(worker_id__in=live_ids)
    return [
        {
            "worker_id": w.worker_id,
            "host": w.host,
            "pid": w.pid,
            "queues": w.queues,
            "concurrency": w.concurrency,
            "in_flight": 0,
            "completed": w.jobs_done,
            "failed": w.jobs_failed,
            "started": w.started_at,
            "last_seen": w.last_heartbeat,
            "last_seen_age": age(w.last_heartbeat, now),
            "stale": True,
            "gone": True,
        }  # fmt: skip
        for w in rows.order_by("worker_id")[:200]
    ]


def attach_current_jobs(workers: list[dict[str, Any]]) -> None:
    """Each worker's running jobs, from the rows (one query for all workers)."""
    ids = [w["worker_id"] for w in workers if not w["gone"]]
    if not ids:
        return
    rows = (
        Job.objects.using(jobs_alias())
        .filter(state=JobState.ACTIVE, worker__in=ids)
        .only("id", "queue", "job_id", "worker", "started_at")
        .order_by("started_at")[: CURRENT_JOBS_SHOWN * len(ids)]
    )
    by_worker: dict[str, list[Job]] = {}
    for job in rows:
        by_worker.setdefault(job.worker, []).append(job)
    for worker in workers:
        worker["jobs"] = by_worker.get(worker["worker_id"], [])[:CURRENT_JOBS_SHOWN]


class WorkerAdmin(admin.ModelAdmin):
    """The WorkerInfo model's admin entry opens the live workers page."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("", wrap(self.workers_view), name="django_jobq_workerinfo_changelist")]

    def workers_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        workers, error = live_workers(now)
        workers += gone_workers({w["worker_id"] for w in workers}, now)
        attach_current_jobs(workers)
        context = {
            **self.admin_site.each_context(request),
            "title": "Workers",
            "opts": self.model._meta,
            "workers": workers,
            "error": error,
            "heartbeat": heartbeat_seconds(),
            "live_every": LIVE_EVERY,
        }
        polled = live_rows(request, {"jobq-workers-body": "admin/django_jobq/workers/_rows.html"},
                           context)  # fmt: skip
        if polled is not None:
            return polled
        return TemplateResponse(request, "admin/django_jobq/workers/list.html", context)
