"""The job list's filters and paginator, built to stay fast on millions of rows.

Django's stock pieces each cost a full pass over the table: a ``COUNT(*)`` per page load and
a ``SELECT DISTINCT`` per field filter. Here the count is capped (or, on PostgreSQL and with no
filter, read from the planner's estimate), queue choices come from the storage's queue
registry, and free-form columns (handler, worker) are filtered by typing a value instead of by
listing every distinct one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from math import ceil
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Page, PageNotAnInteger, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property

from ..states import JobState
from .common import queue_names, rows_of
from .search import SEARCH_IN_VAR, newest

#: Counting stops here: an operator needs "more than 10,000", not the exact figure.
COUNT_CAP = 10_000
#: Pages past this offset are past the end of any list the admin can serve (and an OFFSET of
#: more than 2**63 would be a database error): shown empty without a query.
MAX_OFFSET = 10**9
#: Page numbers shown on each side of the current one.
PAGER_WINDOW = 2


class JobPage(Page):
    """A page read as ``per_page + 1`` rows: the extra row says whether there is a next page,
    which a capped or estimated count cannot say past its cap."""

    def __init__(self, rows: list[Any], number: int, paginator: Paginator, more: bool) -> None:
        super().__init__(rows, number, paginator)
        self.more = more

    def has_next(self) -> bool:
        return self.more


class EstimatedCountPaginator(Paginator):
    """A paginator whose count never scans the whole table, and that serves any page number.

    ``approximate`` tells the template to say "about" / "more than" instead of a number that
    looks exact. Django's paginator refuses a page past ``num_pages``, which for a capped count
    is page 101, and the change list then redirects to ``?e=1``, dropping the filter: here any
    page is read (OFFSET along the list's index) and one past the end is simply empty."""

    approximate = False
    last_page: JobPage | None = None

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        estimate = self._planner_estimate(qs)
        if estimate is not None and estimate > COUNT_CAP:
            self.approximate = True
            return estimate
        counted = qs.order_by()[: COUNT_CAP + 1].count()
        if counted > COUNT_CAP:
            self.approximate = True
        return counted

    def validate_number(self, number: Any) -> int:
        """Any whole number from 1 up (a page past the end is empty, never an error that
        would send the list back to its first page unfiltered); below 1 reads as 1."""
        try:
            value = int(number)
        except (TypeError, ValueError) as exc:
            raise PageNotAnInteger("That page number is not an integer") from exc
        return max(1, value)

    def page(self, number: Any) -> JobPage:  # type: ignore[override]
        number = self.validate_number(number)
        offset = (number - 1) * self.per_page
        rows = [] if offset > MAX_OFFSET else self._rows(offset, self.per_page + 1)
        self.last_page = JobPage(rows[: self.per_page], number, self, len(rows) > self.per_page)
        return self.last_page

    def _rows(self, offset: int, limit: int) -> list[Any]:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return list(qs[offset : offset + limit])
        if qs.query.order_by[:1] not in FINISHED_FIRST:
            return rows_of_slice(qs, offset, limit)
        return finished_then_open(qs, offset, limit)

    @staticmethod
    def _planner_estimate(qs: QuerySet) -> int | None:
        """PostgreSQL's row estimate of the whole table (``pg_class.reltuples``), when the
        list is unfiltered; kept current by autovacuum's ANALYZE."""
        connection = connections[qs.db]
        if connection.vendor != "postgresql" or qs.query.where:
            return None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                [qs.model._meta.db_table],
            )
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] > 0 else None


FINISHED_FIRST = (("finished_at",), ("-finished_at",))


def rows_of_slice(qs: QuerySet, offset: int, limit: int) -> list[Any]:
    """Rows ``offset`` to ``offset + limit`` of ``qs``: their primary keys first, then the
    rows by primary key (a "deferred join"). The keys come from the list's index alone (every
    list index ends with the id), so an OFFSET of 50,000 skips index entries instead of
    reading 50,000 rows (0.15-0.26 s on a million rows); and PostgreSQL's planner, which takes
    every state for as frequent among the finished rows as among all, picks the index that
    leads with the filtered column when it reads only the index."""
    keys = list(qs.values_list("pk", flat=True)[offset : offset + limit])
    if not keys:
        return []
    place = {key: n for n, key in enumerate(keys)}
    return sorted(qs.filter(pk__in=keys), key=lambda row: place[row.pk])


def finished_then_open(qs: QuerySet, offset: int, limit: int) -> list[Any]:
    """Rows ``offset`` to ``offset + limit`` of a list sorted by finish time: the finished
    jobs in that order, then the unfinished ones (no finish time), newest first.

    Read as two queries so each runs along a partial index of finished rows
    (``jobq_job_finished``, ``jobq_job_q_done_id``, ``jobq_job_state_done_id``) or the list's
    creation-time indexes: one ``ORDER BY finished_at`` over every row has no index that does
    not also hold every unfinished row, which each enqueue would pay for (0.9-1.8 s on a
    million rows without one). The finished rows are counted only for a page wholly past
    them."""
    done = qs.filter(finished_at__isnull=False)
    rows = rows_of_slice(done, offset, limit)
    if len(rows) == limit:
        return rows
    done_count = offset + len(rows) if rows or not offset else done.count()
    start = offset + len(rows) - done_count
    waiting = qs.filter(finished_at__isnull=True).order_by("-created_at", "-id")
    return rows + rows_of_slice(waiting, start, limit - len(rows))


def pager(cl: Any) -> dict[str, Any]:
    """Links around the current page: previous, the first page, the pages within
    ``PAGER_WINDOW`` of this one that are known to exist, next while this page is full (or
    the count says more follow), and the last page only when the count is exact."""
    page = cl.paginator.last_page
    current = cl.page_num if page is None else page.number
    has_next = page is not None and page.has_next()
    known = min(cl.result_count, COUNT_CAP + 1) if cl.count_is_approximate else cl.result_count
    last = max(1, ceil(known / cl.list_per_page), current + 1 if has_next else 0)
    if page is not None and not page.object_list and not has_next:
        last = min(last, max(1, current - 1))  # a page past the end: the list stops before it
    around = {1, *range(max(1, current - PAGER_WINDOW), current + PAGER_WINDOW + 1)}
    if not cl.count_is_approximate:
        around.add(last)
    numbers = sorted(n for n in around if n <= last or n == current)
    items: list[dict[str, Any]] = []
    for n in numbers:
        if items and n > items[-1]["number"] + 1:
            items.append({"number": None, "label": "…", "url": None})
        url = cl.get_query_string({PAGE_VAR: n})
        items.append({"number": n, "label": f"{n:,}", "url": url, "current": n == current})
    return {
        "items": items,
        # Past a capped count, whether pages follow the last number shown is not known.
        "more": cl.count_is_approximate and has_next,
        "previous": cl.get_query_string({PAGE_VAR: current - 1}) if current > 1 else None,
        "next": cl.get_query_string({PAGE_VAR: current + 1}) if has_next else None,
        "first": cl.get_query_string({PAGE_VAR: 1}),
    }


#: What Django appends to a sort by one column: the admin's default order, or the primary key.
DEFAULT_TAILS = (["-created_at", "-id"], ["-id"], ["-pk"])
#: Columns with no index in their order: sorting by one sorts the newest ``SORT_ROWS`` jobs
#: of the list, not all of them (a full sort of a million rows took 0.25-0.4 s on PostgreSQL
#: and 0.9-1.7 s before; an index per column would cost every enqueue).
UNINDEXED_SORTS = {"job_id": "job id", "handler": "handler", "priority": "priority",
                   "worker": "worker"}  # fmt: skip
SORT_ROWS = 10_000


class JobChangeList(ChangeList):
    """Exposes whether the count is approximate to the pagination block, sorts along
    indexes, and takes the search's "search in" choice (``in``) as no filter."""

    sort_note: str | None = None

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        queryset = super().get_queryset(request, exclude_parameters)
        fields = [str(f).lstrip("-") for f in queryset.query.order_by]
        unindexed = [UNINDEXED_SORTS[f] for f in fields if f in UNINDEXED_SORTS]
        if not unindexed:
            return queryset
        bounded, since = newest(queryset, SORT_ROWS)
        if since is None:  # no more jobs than that: all of them are sorted
            return queryset
        self.sort_note = (
            f"Sorted the newest {SORT_ROWS:,} jobs of this list (created since "
            f"{since:%Y-%m-%d %H:%M:%S} UTC) by {unindexed[0]}: that column has no index to "
            "sort more jobs by quickly. Narrow the list (a filter or a search) to sort "
            "older ones."
        )
        return bounded

    def get_filters_params(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(SEARCH_IN_VAR, None)
        return lookup_params

    def get_ordering(self, request: HttpRequest, queryset: QuerySet) -> list[Any]:
        """Sorted by queue, the newest of each queue first through the (queue, -created_at,
        -id) index: "queue, -id" alone has no index and sorts the whole table (seconds on a
        million rows on SQLite). Sorted by finish time, the primary key breaks ties in the
        same direction, as the (…, finished_at, id) indexes are read. Other columns (job id,
        handler, priority, worker) have no index in their order: a full sort."""
        ordering = list(super().get_ordering(request, queryset))
        if ordering[:1] == ["queue"] and ordering[1:2] in (["-id"], ["-pk"]):
            ordering[1:1] = ["-created_at"]
        # The (queue, -created_at, -id) index read backwards: queues in reverse, the oldest
        # of each first; the (state, created_at, id) index read forwards: states in order,
        # the oldest of each first (newest first would sort the whole first state: 0.1 s).
        if ordering[:1] in (["-queue"], ["state"]) and ordering[1:] in DEFAULT_TAILS:
            ordering[1:] = ["created_at", "id"]
        if ordering[:1] == ["finished_at"] and ordering[1:] in DEFAULT_TAILS:
            ordering[1:] = ["id"]
        if ordering[:1] == ["-finished_at"] and ordering[1:] in DEFAULT_TAILS:
            ordering[1:] = ["-id"]
        return ordering

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.count_is_approximate = getattr(self.paginator, "approximate", False)
        self.count_cap = COUNT_CAP
        self.count_cap_text = f"{COUNT_CAP:,}"
        self.search_note = getattr(request, "jobq_search_note", None)
        self.search_in = request.GET.get(SEARCH_IN_VAR, "")
        # Django's search bar says "N results (Show all)" whenever the full count is not
        # computed, linking to "?" -- the same page when nothing is filtered. The job list's
        # own search form offers that link only when a search or a filter narrows the list.
        self.is_narrowed = bool(self.query) or self.has_active_filters
        if not self.count_is_approximate:
            self.count_text = f"{self.result_count:,} job{'' if self.result_count == 1 else 's'}"
        elif self.result_count > COUNT_CAP + 1:  # PostgreSQL's planner estimate
            self.count_text = f"about {self.result_count:,} jobs"
        else:
            self.count_text = f"more than {COUNT_CAP:,} jobs"
        page = self.paginator.last_page
        self.page_past_end = page is not None and page.number > 1 and not page.object_list
        self.pager = pager(self) if self.multi_page or self.page_past_end else None


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in queue_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(queue__in=rows_of(value)) if value else queryset


class CreatedWithinFilter(admin.SimpleListFilter):
    """Recent windows an operator actually asks about ("what came in the last hour?")."""

    title = "created within"
    parameter_name = "created"
    WINDOWS = {
        "15m": ("Last 15 minutes", dt.timedelta(minutes=15)),
        "1h": ("Last hour", dt.timedelta(hours=1)),
        "6h": ("Last 6 hours", dt.timedelta(hours=6)),
        "24h": ("Last 24 hours", dt.timedelta(days=1)),
        "7d": ("Last 7 days", dt.timedelta(days=7)),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.WINDOWS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        window = self.WINDOWS.get(self.value() or "")
        if window is None:
            return queryset
        return queryset.filter(created_at__gte=timezone.now() - window[1])


class TextInputFilter(admin.SimpleListFilter):
    """A filter by a typed value (exact match): for columns with too many distinct values to
    list, where a DISTINCT over the table would be the slowest query of the page."""

    template = "admin/django_jobq/input_filter.html"
    field_name = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = (self.value() or "").strip()
        return queryset.filter(**{self.field_name: value}) if value else queryset

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        others = {
            key: value
            for key, value in changelist.get_filters_params().items()
            if key != self.parameter_name
        }
        yield {
            "parameter_name": self.parameter_name,
            "current": self.value() or "",
            "others": [(k, v) for k, values in others.items() for v in _as_list(values)],
            "clear_url": changelist.get_query_string(remove=[self.parameter_name]),
        }


def _as_list(values: Any) -> list[str]:
    return list(values) if isinstance(values, list | tuple) else [values]


class HandlerFilter(TextInputFilter):
    title = "handler"
    parameter_name = "handler"
    field_name = "handler"


class WorkerFilter(TextInputFilter):
    title = "worker"
    parameter_name = "worker"
    field_name = "worker"


STATE_COLORS = {
    JobState.QUEUED: "queued",
    JobState.SCHEDULED: "scheduled",
    JobState.ACTIVE: "active",
    JobState.RETRYING: "retrying",
    JobState.COMPLETED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.BLOCKED: "blocked",
    JobState.LOST: "lost",
}
