"""Failure triage: the dead letters grouped by what went wrong, with Retry and Purge per group.

After an outage a queue holds thousands of dead letters, and the operator's question is "how
many different things broke, and which of them can simply be run again". The page groups
failed jobs by (error type, message with its numbers and ids collapsed), so "timeout after
3.2s on job 8812" and "timeout after 1.7s on job 9911" are one group.

Bounded on any table size: the groups are made from the newest ``SAMPLE`` dead letters (per
queue, through the (queue, state, created_at) index, reading only the error's type and the
start of its message, never a traceback), and the page says so when it stopped there. A
group's Retry or Purge walks every dead letter of the queue(s) once, newest first, by a
keyset cursor on (created_at, id) carried in a signed token, in chunks of ``CHUNK`` rows and
about ``TIME_BUDGET`` seconds per request, then goes on by itself (as "retry all dead
letters" does, ``deadletters.py``). Each dead letter present at the confirmation is touched at
most once: the cursor only moves down (a retried job keeps its creation time, so failing
again puts it back above the cursor), and a row that failed after the confirmation
(``finished_at`` later than ``since``) is left alone. Every change goes through the Queue API
(``retry_many``, ``purge_dead``); each job's outcome goes to the admin's history.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Substr
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from ..job import RetryOutcome
from ..models import Job
from ..states import JobState
from .common import (
    DELETE_PERM,
    RETRY_PERM,
    jobs_alias,
    mirror_banner,
    physical_queue_names,
    queue_for,
    queue_names,
    rows_of,
)
from .queues import QueueAdmin

#: Dead letters grouped per view: the newest this many (of each queue, see ``per_queue``).
SAMPLE = 5000
#: With many queues each one gives at least this many (the page reads at most
#: ``max(SAMPLE, MIN_PER_QUEUE * queues)`` rows).
MIN_PER_QUEUE = 200
#: Characters of a message read and grouped: a 4 KiB message costs no more than its start.
MESSAGE_READ = 300
#: Rows a Retry / Purge run reads per chunk, and its work per request (seconds).
CHUNK = 500
TIME_BUDGET = 10.0
VERBS = {"retry": ("Retry", RETRY_PERM), "purge": ("Purge", DELETE_PERM)}
SALT = "django_jobq.admin.failures"
VIEW_PERM = "django_jobq.view_job"

# What varies between two occurrences of one failure: ids, hashes, addresses, numbers.
_IDS = re.compile(
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"  # a uuid
    r"|\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b",  # hex ids
    re.I,
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SPACE = re.compile(r"\s+")


def normalise(message: str) -> str:
    """The message with what varies per occurrence collapsed: uuids and hex ids to ``<id>``,
    numbers to ``<n>``, runs of white space to one. The start of it only (``MESSAGE_READ``).
    A message without a digit has no id or number: only its spaces are collapsed."""
    text = message[:MESSAGE_READ]
    if any(c.isdigit() for c in text):
        text = _NUMBER.sub("<n>", _IDS.sub("<id>", text))
    return _SPACE.sub(" ", text).strip()


def group_key(error_type: str, message: str) -> str:
    """A short, stable name of a group for URLs and tokens (the group's own text can be
    kilobytes of anything)."""
    digest = hashlib.sha256(f"{error_type}\x00{message}".encode("utf-8", "replace"))
    return digest.hexdigest()[:20]


def _error_of(etype: Any, emsg: Any) -> tuple[str, str]:
    """(type, normalised message) of a row's error; an error that is not a mapping (written
    by hand, or none) is grouped as ``Unknown``."""
    kind = str(etype) if etype not in (None, "") else "Unknown"
    return kind[:200], normalise("" if emsg is None else str(emsg))


def dead_rows(physical: list[str]) -> QuerySet[Any]:
    """Dead-letter rows of these queues with only the error's type and the start of its
    message (``KT``: ``->>`` on PostgreSQL, ``json_extract`` on SQLite), newest first."""
    rows: QuerySet[Any] = (  # Any: the stubs know no annotated names (etype, emsg)
        Job.objects.using(jobs_alias())
        .filter(queue__in=physical, state=JobState.FAILED)
        .annotate(etype=KT("error__type"), emsg=Substr(KT("error__message"), 1, MESSAGE_READ))
    )
    return rows


@dataclass
class Group:
    """One kind of failure among the grouped dead letters."""

    key: str
    error_type: str
    message: str
    count: int = 0
    first: dt.datetime | None = None
    last: dt.datetime | None = None
    queues: Counter[str] = field(default_factory=Counter)
    sample_pk: int | None = None
    sample_id: str = ""
    sample_created: dt.datetime | None = None

    @property
    def by_queue(self) -> list[tuple[str, int]]:
        """(queue, jobs) biggest first (a template reading ``queues.most_common`` would get
        the Counter's 0 for a missing key)."""
        return self.queues.most_common()

    def add(self, pk: int, queue: str, job_id: str, created: dt.datetime,
            finished: dt.datetime | None) -> None:  # fmt: skip
        self.count += 1
        self.queues[queue] += 1
        if finished is not None:
            self.first = finished if self.first is None else min(self.first, finished)
            self.last = finished if self.last is None else max(self.last, finished)
        if self.sample_created is None or created > self.sample_created:
            self.sample_pk, self.sample_id, self.sample_created = pk, job_id, created


@dataclass
class Triage:
    """The groups of one view and how much of the dead letters they cover."""

    groups: list[Group]
    read: int
    per_queue: int
    capped: list[str]  # queues with more dead letters than were grouped
    error: str | None = None


def per_queue(physical: list[str]) -> int:
    return max(MIN_PER_QUEUE, SAMPLE // max(1, len(physical)))


def triage(physical: list[str]) -> Triage:
    """Group the newest dead letters of each queue: one indexed read of at most
    ``per_queue`` rows a queue (the (queue, state, created_at) index, backwards)."""
    cap = per_queue(physical)
    groups: dict[tuple[str, str], Group] = {}
    read, capped = 0, []
    for name in physical:
        rows = (
            dead_rows([name]).order_by("-created_at")
            .values_list("pk", "job_id", "created_at", "finished_at", "etype", "emsg")[:cap]
        )  # fmt: skip
        n = 0
        for pk, job_id, created, finished, etype, emsg in rows:
            n += 1
            found = _error_of(etype, emsg)
            group = groups.get(found)
            if group is None:  # hashed once per group, not per row
                group = groups[found] = Group(group_key(*found), *found)
            group.add(pk, name, job_id, created, finished)
        read += n
        if n >= cap:
            capped.append(name)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.error_type, g.message))
    return Triage(ordered, read, cap, capped)


def scope(request: HttpRequest, raw: str | None = None) -> tuple[str, list[str]]:
    """The queue a page is about ("" for every queue) and its physical queues; a queue that
    does not exist is a 404, not an empty page."""
    name = request.GET.get("queue", "") if raw is None else raw
    if not name:
        return "", physical_queue_names()
    if name not in queue_names():
        raise Http404(f"No queue {name!r}.")
    return name, rows_of(name)


# -- the Retry / Purge run over one group -----------------------------------------------------


@dataclass
class Run:
    """Where a Retry or Purge of one group stands; signed into the page between requests."""

    verb: str
    key: str
    queue: str  # "" for every queue
    since: int  # epoch ms of the confirmation: rows that failed after it are left alone
    left: list[str]  # physical queues still to walk, the current one first
    cursor: tuple[str, int] | None = None  # (created_at ISO, pk) of the last row looked at
    counts: Counter[str] = field(default_factory=Counter)
    looked: int = 0  # dead letters of any group read so far
    newer: int = 0  # of this group, left alone: failed after the confirmation
    error: str | None = None

    @property
    def finished(self) -> bool:
        return not self.left and self.error is None

    @property
    def done(self) -> int:
        return self.counts.get(RetryOutcome.RETRIED.value if self.verb == "retry" else "purged", 0)

    @property
    def handled(self) -> int:
        return sum(self.counts.values())

    def token(self) -> str:
        data = {"v": self.verb, "k": self.key, "q": self.queue, "s": self.since,
                "l": self.left, "c": self.cursor and list(self.cursor), "o": dict(self.counts),
                "n": self.looked, "w": self.newer}  # fmt: skip
        return signing.dumps(data, salt=SALT, compress=True)

    @classmethod
    def from_token(cls, token: str) -> Run:
        """Raises ``signing.BadSignature`` for a token this server did not sign."""
        d = signing.loads(token, salt=SALT)
        cursor = None if d["c"] is None else (str(d["c"][0]), int(d["c"][1]))
        counts = Counter({str(k): int(v) for k, v in d["o"].items()})
        return cls(str(d["v"]), str(d["k"]), str(d["q"]), int(d["s"]),
                   [str(q) for q in d["l"]], cursor, counts, int(d["n"]), int(d["w"]))  # fmt: skip


def _chunk(run: Run, chunk: int) -> list[tuple[int, str, str, Any, Any, Any]]:
    """The next rows of the current queue below the cursor: a keyset page on the (queue,
    state, created_at) index, newest first, the primary key breaking ties."""
    rows = dead_rows([run.left[0]])
    if run.cursor is not None:
        at, pk = dt.datetime.fromisoformat(run.cursor[0]), run.cursor[1]
        # The first condition alone is redundant; it makes the cursor an index bound (the
        # OR is only a filter: each chunk would walk the index from the newest row again).
        rows = rows.filter(created_at__lte=at).filter(
            Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk)
        )
    picked = rows.order_by("-created_at", "-pk").values_list(
        "pk", "job_id", "state", "created_at", "finished_at", "etype", "emsg"
    )
    return [(pk, jid, st, c, f, (et, em)) for pk, jid, st, c, f, et, em in picked[:chunk]]


def advance(run: Run, *, budget: float, chunk: int) -> tuple[Run, list[tuple[Job, str]]]:
    """Walk on, chunk by chunk, until every queue is walked or the budget is spent (at least
    one chunk per call, so every request moves on), sending this group's dead letters to the
    Queue API. A storage error stops the run after the last finished chunk: the cursor stays
    before that chunk, so going on tries it again (a retried id is then ``waiting``, counted,
    never run twice). Returns the run moved on and each job's outcome, for the history."""
    deadline = time.monotonic() + budget
    acted: list[tuple[Job, str]] = []
    run.error = None
    since = dt.datetime.fromtimestamp(run.since / 1000, tz=dt.UTC)
    started = False
    keys: dict[tuple[str, str], str] = {}  # each kind of error hashed once
    while run.left and (not started or time.monotonic() < deadline):
        started = True
        rows = _chunk(run, chunk)
        if not rows:
            run.left.pop(0)
            run.cursor = None
            continue
        name = run.left[0]
        mine: list[Job] = []
        for pk, job_id, state, _, finished, (etype, emsg) in rows:
            found = _error_of(etype, emsg)
            if found not in keys:
                keys[found] = group_key(*found)
            if keys[found] != run.key:
                continue
            if finished is not None and finished > since:
                run.newer += 1
                continue
            mine.append(Job(pk=pk, queue=name, job_id=job_id, state=state))
        try:
            outcomes = _apply(run.verb, name, [j.job_id for j in mine])
        except Exception as exc:  # storage unreachable: say so; the chunk is tried again
            run.error = f"{type(exc).__name__}: {exc}"
            return run, acted
        for job in mine:
            run.counts[outcomes[job.job_id]] += 1
            acted.append((job, outcomes[job.job_id]))
        run.looked += len(rows)
        last = rows[-1]
        run.cursor = (last[3].isoformat(), last[0])
    return run, acted


def _apply(verb: str, name: str, ids: list[str]) -> dict[str, str]:
    """Each id's outcome from the Queue API: ``retry_many`` says it per id; ``purge_dead``
    deletes the ids that are still dead letters, so the others are looked up after."""
    if not ids:
        return {}
    queue = queue_for(name)
    if verb == "retry":
        return {job_id: o.value for job_id, o in queue.retry_many(ids).items()}
    purged = queue.purge_dead(ids)
    if purged == len(ids):
        return dict.fromkeys(ids, "purged")
    out = {}
    for job_id in ids:
        status = queue.get_status(job_id)
        out[job_id] = "purged" if status is None else f"not purged: {status.state.value}"
    return out


def log(request: HttpRequest, run: Run, label: str, acted: list[tuple[Job, str]]) -> None:
    """Each job's outcome in the admin's history, one bulk insert per distinct outcome."""
    by_text: dict[str, list[Job]] = {}
    for job, text in acted:
        by_text.setdefault(text, []).append(job)
    for text, jobs in by_text.items():
        flag = DELETION if text == "purged" else CHANGE
        LogEntry.objects.log_actions(
            request.user.pk or 0, jobs, flag, f"{label} (failure group): {text}"
        )


# -- views -------------------------------------------------------------------------------------


def _context(admin: Any, request: HttpRequest, title: str) -> dict[str, Any]:
    return {
        **admin.admin_site.each_context(request),
        "title": title,
        "opts": admin.model._meta,
        "can_retry": request.user.has_perm(RETRY_PERM),
        "can_purge": request.user.has_perm(DELETE_PERM),
        "mirror_banner": mirror_banner(),
    }


def list_view(admin: Any, request: HttpRequest) -> HttpResponse:
    """The groups of one queue (``?queue=``) or of every queue."""
    if not request.user.has_perm(VIEW_PERM):
        raise PermissionDenied
    name, physical = scope(request)
    result = triage(physical)
    context = {
        **_context(admin, request, f"Failures of queue {name}" if name else "Failures"),
        "queue_name": name,
        "triage": result,
        "queues": queue_names(),
        "sample": SAMPLE,
    }
    return TemplateResponse(request, "admin/django_jobq/failures/list.html", context)


def _find(physical: list[str], key: str) -> Group | None:
    return next((g for g in triage(physical).groups if g.key == key), None)


def action_view(admin: Any, request: HttpRequest, verb: str) -> HttpResponse:
    """GET: the group and its count, to confirm. POST with a signed run: the next chunks,
    then the outcome counts so far and a way to go on (by itself)."""
    if verb not in VERBS:
        raise Http404(f"No such failure action {verb!r}.")
    label, perm = VERBS[verb]
    if not request.user.has_perm(perm):
        raise PermissionDenied
    run = None
    if request.method == "POST":
        try:
            run = Run.from_token(request.POST.get("run", ""))
        except (signing.BadSignature, KeyError, TypeError, ValueError, IndexError):
            return HttpResponseBadRequest("This run's state is damaged: start again from the page.")
        if run.verb != verb:
            return HttpResponseBadRequest("This run belongs to another action.")
    key = run.key if run else request.GET.get("group", "")
    if not re.fullmatch(r"[0-9a-f]{20}", key):
        return HttpResponseBadRequest("No such failure group: pick one on the failures page.")
    name, physical = scope(request, run.queue if run else None)
    if run is None:
        run = Run(verb, key, name, int(time.time() * 1000), list(physical))
    elif request.POST.get("confirm") == "yes" and not run.finished:
        run, acted = advance(run, budget=TIME_BUDGET, chunk=CHUNK)
        log(request, run, label, acted)
        if run.finished or run.error:
            level = messages.WARNING if run.error else messages.SUCCESS
            admin.message_user(request, f"{label}: {run.done:,} of {run.handled:,} done.", level)
    group = _find(physical, key)
    back = reverse("admin:django_jobq_failures")
    context = {
        **_context(admin, request, f"{label} a failure group"),
        "verb": verb,
        "label": label,
        "group": group,
        "run": run,
        "token": run.token(),
        "queue_name": name,
        "started": run.cursor is not None or run.looked or run.handled or run.error,
        "back": back + (f"?queue={name}" if name else ""),
        "outcomes": sorted(run.counts.items(), key=lambda kv: (-kv[1], kv[0])),
        "ok": RetryOutcome.RETRIED.value if verb == "retry" else "purged",
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/django_jobq/failures/action.html", context)


class TriageQueueAdmin(QueueAdmin):
    """The Queues entry with the failure triage pages (``queueconfig/failures/``)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("failures/", wrap(self.failures_view), name="django_jobq_failures"),
            path(
                "failures/<str:verb>/",
                wrap(self.failures_action_view),
                name="django_jobq_failures_action",
            ),
            *super().get_urls(),
        ]

    def failures_view(self, request: HttpRequest) -> HttpResponse:
        return list_view(self, request)

    def failures_action_view(self, request: HttpRequest, verb: str) -> HttpResponse:
        return action_view(self, request, verb)
