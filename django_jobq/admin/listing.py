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
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property

from ..states import JobState
from .common import queue_names, rows_of

#: Counting stops here: an operator needs "more than 10,000", not the exact figure.
COUNT_CAP = 10_000


class EstimatedCountPaginator(Paginator):
    """A paginator whose count never scans the whole table.

    ``approximate`` tells the template to say "about" / "more than" instead of a number that
    looks exact."""

    approximate = False

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


class JobChangeList(ChangeList):
    """Exposes whether the count is approximate to the pagination block, and sorts by queue
    along an index."""

    def get_ordering(self, request: HttpRequest, queryset: QuerySet) -> list[Any]:
        """Sorted by queue, the newest of each queue first through the (queue, -created_at,
        -id) index: "queue, -id" alone has no index and sorts the whole table (seconds on a
        million rows on SQLite)."""
        ordering = list(super().get_ordering(request, queryset))
        if ordering[:1] == ["queue"] and ordering[1:2] in (["-id"], ["-pk"]):
            ordering[1:1] = ["-created_at"]
        return ordering

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.count_is_approximate = getattr(self.paginator, "approximate", False)
        self.count_cap = COUNT_CAP
        # Django's search bar says "N results (Show all)" whenever the full count is not
        # computed, linking to "?" -- the same page when nothing is filtered. The job list's
        # own search form offers that link only when a search or a filter narrows the list.
        self.is_narrowed = bool(self.query) or self.has_active_filters
        if not self.count_is_approximate:
            self.count_text = f"{self.result_count} job{'' if self.result_count == 1 else 's'}"
        elif self.result_count > COUNT_CAP + 1:  # PostgreSQL's planner estimate
            self.count_text = f"about {self.result_count} jobs"
        else:
            self.count_text = f"more than {COUNT_CAP} jobs"


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
