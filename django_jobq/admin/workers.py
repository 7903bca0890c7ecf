"""The workers page (the admin's "Workers" entry): live workers from the storage's registry,
not from the mirror, so a worker that died a second ago shows as stale now.

A worker re-registers on every heartbeat (a third of its lease); its registration expires
after three heartbeats. Missing two heartbeats marks it stale: alive on paper, probably stuck
or partitioned. Rows of the WorkerInfo table that the registry no longer lists (a worker
killed without deregistering, database backend) are shown as gone until they are cleaned up.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from ..backend import get_storage
from ..conf import jobq_settings
from ..job import ms_to_datetime
from ..models import Job, WorkerInfo
from ..states import JobState
from .common import LIVE_EVERY, age, jobs_alias, live_rows

#: Who may stop a worker or change its concurrency from the page.
CONTROL_PERM = "django_jobq.change_workerinfo"
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
            "pool_size": info.get("pool_size") or info.get("concurrency", 0),
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
        return [
            path("", wrap(self.workers_view), name="django_jobq_workerinfo_changelist"),
            path(
                "control/",
                wrap(require_POST(self.control_view)),
                name="django_jobq_workerinfo_control",
            ),
        ]

    def control_view(self, request: HttpRequest) -> HttpResponse:
        """Ask a live worker to stop gracefully or to run N jobs at once. The command waits
        in the storage until the worker's next heartbeat takes it (within seconds); only a
        worker the registry lists can be asked, and each request is in the admin history."""
        if not request.user.has_perm(CONTROL_PERM):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse("admin:django_jobq_workerinfo_changelist"))
        worker_id, op = request.POST.get("worker_id", ""), request.POST.get("op", "")
        workers, error = live_workers()
        worker = next((w for w in workers if w["worker_id"] == worker_id), None)
        if worker is None:
            self.message_user(request, error or f"No live worker {worker_id!r}.", messages.ERROR)
            return back
        if op == "stop":
            command: dict[str, Any] = {"op": "stop"}
            said = "Stop (gracefully)"
        elif op == "concurrency":
            raw = request.POST.get("n", "").strip()
            top = int(worker["pool_size"] or 1)
            if not raw.isdigit() or not 1 <= int(raw) <= top:
                wanted = f"a whole number from 1 to {top} (the pool this worker started)"
                self.message_user(request, f"Concurrency must be {wanted}.", messages.ERROR)
                return back
            if worker["autoscale"]:
                itself = "This worker scales its concurrency itself (--autoscale): not changed."
                self.message_user(request, itself, messages.ERROR)
                return back
            command = {"op": "concurrency", "n": int(raw)}
            said = f"Set concurrency to {raw}"
        else:
            self.message_user(request, f"No such worker command {op!r}.", messages.ERROR)
            return back
        get_storage().send_worker_command(worker_id, {**command, "by": request.user.get_username()})
        LogEntry.objects.create(
            user_id=cast(Any, request.user.pk),  # logged in: admin_view
            content_type=ContentType.objects.get_for_model(WorkerInfo),
            object_id=worker_id[:200],
            object_repr=f"worker {worker_id}"[:200],
            action_flag=CHANGE,
            change_message=said,
        )
        self.message_user(
            request,
            f"{said}: asked of worker {worker_id}; it takes it at its next heartbeat "
            f"(every {heartbeat_seconds():g} s).",
            messages.SUCCESS,
        )
        return back

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
            "can_control": request.user.has_perm(CONTROL_PERM),
            "live_every": LIVE_EVERY,
        }
        polled = live_rows(request, {"jobq-workers-body": "admin/django_jobq/workers/_rows.html"},
                           context)  # fmt: skip
        if polled is not None:
            return polled
        return TemplateResponse(request, "admin/django_jobq/workers/list.html", context)
