"""Jobs by hand: an operator enqueues a job from the admin (a form, empty or copied from a
job), runs a finished job again, moves a waiting job's due time, or runs every delayed job of
a queue now (docs/admin.md, "Jobs by hand").

Nothing here writes a row or a key: the form is checked by ``Queue.build`` and the job sent
with ``Queue.enqueue``; due times go through ``Queue.change_run_at`` / ``Queue.promote``. A job
id that exists already is the storage's answer (``duplicate``), so two operators submitting
the same id make one job.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from . import promote
from .views import add_view, created_view, reschedule_view, run_again_view, tools

__all__ = ["tools", "urls"]


def urls(admin: Any) -> list[URLPattern]:
    """The views above under ``job/byhand/``, behind the admin's login (``admin_view``: CSRF
    kept), for ``JobAdmin.get_urls``."""
    wrap = admin.admin_site.admin_view

    def on_job(view: Any) -> Any:
        def bound(request: HttpRequest, pk: str) -> HttpResponse:
            return view(admin, request, admin._job_or_404(request, pk))

        return wrap(bound)

    def add(request: HttpRequest) -> HttpResponse:
        return add_view(admin, request)

    def created(request: HttpRequest) -> HttpResponse:
        return created_view(admin, request)

    def promote_all(request: HttpRequest, queue: str) -> HttpResponse:
        return promote.view(admin, request, queue)

    return [
        path("byhand/add/", wrap(add), name="django_jobq_job_byhand_add"),
        path("byhand/new/", wrap(created), name="django_jobq_job_byhand_created"),
        path("byhand/<str:pk>/duplicate/", on_job(add_view), name="django_jobq_job_duplicate"),
        path("byhand/<str:pk>/again/", on_job(run_again_view), name="django_jobq_job_again"),
        path(
            "byhand/<str:pk>/reschedule/",
            on_job(reschedule_view),
            name="django_jobq_job_reschedule",
        ),
        path("byhand/promote/<str:queue>/", wrap(promote_all), name="django_jobq_job_promote_all"),
    ]
