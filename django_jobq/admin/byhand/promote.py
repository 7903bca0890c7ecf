"""Promote all delayed jobs of a queue: every scheduled or retrying job runs now.

A queue can hold any number of them, so this works like the actions over a filter
(``filtered.py``), whose run it reuses: a confirmation page with the count, then the jobs
newest first in chunks read anew (keyset by primary key, never past the newest row of the
confirmation), each sent to ``Queue.promote`` on its own (the job list's *Run now*), about ten
seconds per request, the cursor and the counts in a signed token, the page going on by
itself. A flow parent parked until its children finish is not delayed: it is left out.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from ... import permissions as ops
from ...models import Job
from ...permissions import user_may
from ...states import JobState
from .. import filtered
from ..common import jobs_alias, queue_names, rows_of

#: The job list's single-job action each delayed job gets.
ACTION = "run_now"
DELAYED = (JobState.SCHEDULED, JobState.RETRYING)
#: Flow parents waiting for their children are parked from this year on (detail.PARKED_YEAR).
PARKED = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


def delayed(queue: str, upto: int | None = None) -> QuerySet[Job]:
    """The delayed rows of ``queue`` (all its partitions), newest first; at most ``upto``."""
    rows = Job.objects.using(jobs_alias()).filter(
        queue__in=rows_of(queue), state__in=DELAYED, run_at__lt=PARKED
    )
    if upto is not None:
        rows = rows.filter(pk__lte=upto)
    return rows.order_by("-pk").only("pk", "queue", "job_id", "state")


def view(admin: Any, request: HttpRequest, queue: str) -> HttpResponse:
    """GET: how many jobs would run now, to confirm. POST with the signed run: the next
    chunks, then the counts so far and a way to go on (by itself while ticked)."""
    if not user_may(request.user, ops.CHANGE):
        raise PermissionDenied
    if queue not in queue_names():
        raise Http404(f"No queue {queue!r}.")
    run = None
    if request.method == "POST":
        try:
            run = filtered.Run.from_token(request.POST.get("run", ""))
        except (signing.BadSignature, KeyError, TypeError, ValueError):
            return HttpResponseBadRequest("This run's state is damaged: start again.")
        if run.name != ACTION or run.query != queue:
            return HttpResponseBadRequest("This run belongs to another queue or action.")
    if run is None:
        newest = Job.objects.using(jobs_alias()).order_by("-pk").values_list("pk", flat=True)
        run = filtered.Run(ACTION, queue, newest.first() or 0, 0)
        run.total = delayed(queue, run.upto).order_by().count()
    elif request.POST.get("confirm") == "yes":
        run, outcomes = filtered.advance(
            run, delayed(queue, run.upto), budget=filtered.TIME_BUDGET, chunk=filtered.CHUNK
        )
        by_text: dict[str, list[Job]] = {}
        for item in outcomes:
            by_text.setdefault(item.text, []).append(item.job)
        for text, jobs in by_text.items():
            LogEntry.objects.log_actions(
                request.user.pk or 0, jobs, CHANGE, f"Promote all delayed: {text}"
            )
        if run.finished or run.error:
            admin.message_user(
                request,
                f"Queue {queue}: {run.done:,} of {run.handled:,} delayed job(s) run now.",
                messages.WARNING if run.error else messages.SUCCESS,
            )
    left = None
    if run.cursor is not None and not run.finished:
        left = delayed(queue, run.upto).filter(pk__lt=run.cursor).order_by().count()
    context = {
        **admin.admin_site.each_context(request),
        "title": f"Promote all delayed jobs of queue {queue}",
        "opts": admin.model._meta,
        "queue_name": queue,
        "run": run,
        "token": run.token(),
        "left": left,
        "queue_url": reverse("admin:django_jobq_queue_detail", args=[queue]),
        "outcomes": sorted(run.counts.items(), key=lambda kv: (-kv[1], kv[0])),
        "oks": run.oks,
    }
    return TemplateResponse(request, "admin/django_jobq/job/promote.html", context)
