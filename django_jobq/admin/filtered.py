"""Bulk actions over a whole filter of the job list ("all 80,000 failed jobs of queue
emails"), not only over a ticked selection of at most ``MAX_BULK`` jobs.

The set is defined by the list's own filters and search (the same ``ChangeList`` the page
shows), narrowed to the states the action applies to and to the rows that existed when the
operator confirmed (primary key at most ``upto``): a job enqueued afterwards is never swept
in. The work walks that set by primary key, newest first, in chunks of ``CHUNK`` rows read
anew each time (keyset pagination: no OFFSET, no list of ids held in memory, no transaction
around the run), sends each job to the Queue API on its own, exactly as a ticked selection
does, and stops after ``TIME_BUDGET`` seconds so that no proxy times the request out. The
cursor and the outcome counts so far travel in a signed token; the next request goes on
from there. So a job is acted on at most once per run (the cursor only moves down), a job
that left the filter meanwhile is not touched, and a job that changed state meanwhile is
decided by the storage (the Queue API's outcome, "completed", "waiting", … is counted).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse

from ..models import Job
from .actions import ACTIONS, Outcome, filter_query, perform

CHUNK = 500
TIME_BUDGET = 10.0
SALT = "django_jobq.admin.filtered"


@dataclass
class Run:
    """Where a run over a filter stands; signed into the page between requests."""

    name: str
    query: str
    upto: int
    total: int
    cursor: int | None = None  # the last primary key handled; None: not started
    counts: Counter[str] = field(default_factory=Counter)
    oks: set[str] = field(default_factory=set)  # the outcomes that did what was asked
    error: str | None = None
    finished: bool = False

    def token(self) -> str:
        data = {"n": self.name, "q": self.query, "u": self.upto, "t": self.total,
                "c": self.cursor, "o": dict(self.counts), "k": sorted(self.oks)}  # fmt: skip
        return signing.dumps(data, salt=SALT, compress=True)

    @classmethod
    def from_token(cls, token: str) -> Run:
        """Raises ``signing.BadSignature`` for a token this server did not sign."""
        data = signing.loads(token, salt=SALT)
        cursor = None if data["c"] is None else int(data["c"])
        counts = Counter({str(k): int(v) for k, v in data["o"].items()})
        return cls(str(data["n"]), str(data["q"]), int(data["u"]), int(data["t"]), cursor,
                   counts, {str(k) for k in data["k"]})  # fmt: skip

    @property
    def handled(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(n for text, n in self.counts.items() if text in self.oks)


def changelist(admin: Any, request: HttpRequest, query: str) -> Any:
    """The job list's ChangeList for ``query``: its filters, search and their validation."""
    listed = copy.copy(request)
    listed.GET = QueryDict(query)
    return admin.get_changelist_instance(listed)


def target(cl: Any, name: str, upto: int) -> QuerySet[Job]:
    """The rows a run walks: the list's set, in the action's states, existing at confirmation."""
    return (
        cl.queryset.filter(state__in=ACTIONS[name].over_a_filter, pk__lte=upto)
        .order_by("-pk")
        .only("pk", "queue", "job_id", "state")
    )


def describe(cl: Any) -> list[str]:
    """The filter as an operator reads it: ``queue = emails``, ``state = Failed``, …"""
    parts = []
    for spec in cl.filter_specs:
        if not set(spec.expected_parameters()) & set(cl.params):
            continue
        value = getattr(spec, "field_name", None) and spec.value()  # a typed-value filter
        if not value:
            picked = [c for c in spec.choices(cl) if c.get("selected")]
            value = ", ".join(str(c["display"]) for c in picked) or " and ".join(
                f"{key} {cl.params[key]}"  # a value none of its links gives: as typed
                for key in spec.expected_parameters() if key in cl.params
            )  # fmt: skip
        parts.append(f"{spec.title} = {value}")
    if cl.query:
        parts.append(f"search “{cl.query}”")
    return parts


def advance(
    run: Run, rows: QuerySet[Job], *, budget: float, chunk: int
) -> tuple[Run, list[Outcome]]:
    """Act on the next jobs of ``rows``, a chunk read at a time, until they run out or the
    budget is spent (at least one job per call, so every request moves on). A storage error
    stops the run before that job: the cursor stays above it, so the next request tries it
    again. Returns the run moved on and the outcomes, for the admin's history."""
    deadline = time.monotonic() + budget
    acted: list[Outcome] = []
    run.error = None
    while True:
        batch = rows if run.cursor is None else rows.filter(pk__lt=run.cursor)
        jobs = list(batch[:chunk])
        if not jobs:
            run.finished = True
            return run, acted
        for job in jobs:
            [item] = perform(run.name, [job], {})
            if item.text.startswith("error: "):
                run.error = item.text[len("error: ") :]
                return run, acted
            run.counts[item.text] += 1
            if item.ok:
                run.oks.add(item.text)
            acted.append(item)
            run.cursor = job.pk
            if time.monotonic() >= deadline:
                return run, acted


def log(request: HttpRequest, name: str, outcomes: list[Outcome]) -> None:
    """Each job's outcome in the admin's history, one bulk insert per distinct outcome."""
    label = ACTIONS[name].label
    by_text: dict[str, list[Job]] = {}
    for item in outcomes:
        by_text.setdefault(item.text, []).append(item.job)
    for text, jobs in by_text.items():
        LogEntry.objects.log_actions(
            request.user.pk or 0, jobs, CHANGE, f"{label} (over a filter): {text}"
        )


def view(admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    """GET (or POST without ``confirm``): the count and the filter, to confirm. POST with a
    signed run: the next chunks, then the outcome counts so far and a way to go on."""
    spec = ACTIONS.get(name)
    if spec is None or not spec.over_a_filter:
        return HttpResponseBadRequest(f"No action {name!r} over a filter.")
    if not request.user.has_perm(spec.perm):
        raise PermissionDenied
    run = None
    if request.method == "POST":
        try:
            run = Run.from_token(request.POST.get("run", ""))
        except (signing.BadSignature, KeyError, TypeError, ValueError):
            return HttpResponseBadRequest("This run's state is damaged: start again from the list.")
        if run.name != name:
            return HttpResponseBadRequest("This run belongs to another action.")
    query = run.query if run else filter_query(request.GET)
    try:
        cl = changelist(admin, request, query)
    except IncorrectLookupParameters:
        return HttpResponseBadRequest("The list's filter is not valid any more.")
    alias = cl.queryset.db
    if run is None:
        newest = Job.objects.using(alias).order_by("-pk").values_list("pk", flat=True).first()
        upto = newest or 0
        # Every row is at most ``upto`` now: counted without that bound, the count can be
        # read from an index on state alone (a heap visit per row otherwise).
        total = cl.queryset.filter(state__in=spec.over_a_filter).order_by().count()
        run = Run(name, query, upto, total)
    elif request.POST.get("confirm") == "yes":
        run, outcomes = advance(run, target(cl, name, run.upto), budget=TIME_BUDGET, chunk=CHUNK)
        log(request, name, outcomes)
        if run.finished or run.error:
            level = messages.WARNING if run.error else messages.SUCCESS
            admin.message_user(
                request, f"{spec.label}: {run.done} of {run.handled} job(s) done.", level
            )
    rows = target(cl, name, run.upto)
    left = None
    if run.cursor is not None and not run.finished:
        left = rows.filter(pk__lt=run.cursor).count()
    context = {
        **admin.admin_site.each_context(request),
        "title": f"{spec.label}: every job matching the filter",
        "opts": admin.model._meta,
        "spec": spec,
        "run": run,
        "token": run.token(),
        "left": left,
        "filter": describe(cl),
        "states": [s.value for s in spec.over_a_filter],
        "list_url": reverse("admin:django_jobq_job_changelist") + (f"?{query}" if query else ""),
        "outcomes": [
            (text, n, text in run.oks)
            for text, n in sorted(run.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }
    return TemplateResponse(request, "admin/django_jobq/job/filtered.html", context)
