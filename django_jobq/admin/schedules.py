"""Admin for periodic schedules. The form runs the same validation as the reaper relies on, so
a bad cron, time zone or job option is refused next to its field instead of failing silently
at every sweep."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime

from ..models import Job, Schedule
from ..schedules.core import describe, fire_now, validate_schedule
from ..schedules.sync import SETTINGS, is_drifted
from .common import duration, jobs_alias


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = [
            "name",
            "queue",
            "cron",
            "interval",
            "timezone",
            "payload",
            "job_options",
            "enabled",
            "missed",
        ]

    # A blank JSON field cleans to None; the model's default ({}) is what a blank box means.
    def clean_payload(self) -> Any:
        value = self.cleaned_data.get("payload")
        return {} if value is None else value

    def clean_job_options(self) -> Any:
        value = self.cleaned_data.get("job_options")
        return {} if value is None else value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            # Field-level errors (bad JSON, a negative interval) already explain themselves;
            # validating a half-built schedule would only add noise.
            return cleaned
        candidate = Schedule(
            **{name: cleaned.get(name) for name in self.Meta.fields if name in cleaned}
        )
        try:
            validate_schedule(candidate)
        except forms.ValidationError as exc:
            for field, errors in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, errors)
        return cleaned


def _when_in_zones(value: dt.datetime | None, zone: str) -> str:
    """The admin's time with its zone (as on the job pages), and the schedule's own local time
    when its cron runs in another zone: a Europe/Berlin "0 3 * * *" reads 03:00 there."""
    if value is None:
        return "—"
    shown = localtime(value)
    text = f"{shown:%Y-%m-%d %H:%M:%S %Z}"
    try:
        own = value.astimezone(zoneinfo.ZoneInfo(zone)) if zone else None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        own = None
    if own is None or own.utcoffset() == shown.utcoffset() and own.tzname() == shown.tzname():
        return text
    return format_html("{}<br><small>{} {}</small>", text, f"{own:%Y-%m-%d %H:%M}", zone)


#: Runs shown per schedule: in the list (one badge each) and on the schedule's page.
RUNS_IN_LIST = 5
RUNS_ON_PAGE = 20
_RUN_FIELDS = ("id", "job_id", "state", "created_at", "started_at", "finished_at")


def recent_runs(schedule: Schedule, limit: int = RUNS_ON_PAGE) -> list[dict[str, Any]]:
    """The last ``limit`` jobs the schedule enqueued, newest first, with their state and how
    long they ran. Read through the (queue, job_id) unique index: a tick's id is
    ``schedule.<name>.<epoch seconds>`` (ten digits until 2286, so id order is tick order)
    and a manual run's ``schedule.<name>.manual-<epoch ms>``; each kind is one backward range
    scan of at most ``limit`` rows, whatever the number of runs kept."""
    base = f"schedule.{schedule.name}."
    rows = _id_range(schedule.queue, base + "0", base + ":", 2 * limit)  # digits: 0-9 < ":"
    rows += _id_range(schedule.queue, base + "manual-", base + "manual.", 2 * limit)
    mine = re.compile(re.escape(base) + r"(?:manual-)?\d+")  # not schedule "<name>.<x>"'s runs
    picked = [r for r in rows if mine.fullmatch(r["job_id"])]
    picked.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
    for run in picked[:limit]:
        ran = None
        if run["started_at"] and run["finished_at"]:
            ran = (run["finished_at"] - run["started_at"]).total_seconds() * 1000
        run["duration"] = duration(ran) if ran is not None else ""
        run["url"] = reverse("admin:django_jobq_job_change", args=[run["id"]])
    return picked[:limit]


def _id_range(queue: str, low: str, high: str, limit: int) -> list[dict[str, Any]]:
    """Rows of ``queue`` with ``low <= job_id < high``, highest id first, at most ``limit``.
    PostgreSQL: the unique index orders job_id by ``varchar_pattern_ops`` (bytes), which the
    ordinary ``<`` and ``ORDER BY`` (the collation's order) cannot use, so the range and the
    order are spelled with its operators. SQLite and the rest compare text as bytes already."""
    alias = jobs_alias()
    connection = connections[alias]
    if connection.vendor != "postgresql":
        rows = Job.objects.using(alias).filter(queue=queue, job_id__gte=low, job_id__lt=high)
        return list(rows.order_by("-job_id").values(*_RUN_FIELDS)[:limit])
    table = connection.ops.quote_name(Job._meta.db_table)
    sql = (  # the table is the model's own name, quoted; every value is a parameter
        f"SELECT {', '.join(_RUN_FIELDS)} FROM {table} WHERE queue = %s "  # noqa: S608
        "AND job_id ~>=~ %s AND job_id ~<~ %s ORDER BY job_id USING ~>~ LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [queue, low, high, limit])
        return [dict(zip(_RUN_FIELDS, row, strict=True)) for row in cursor.fetchall()]


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = (
        "name",
        "queue",
        "timing",
        "enabled",
        "next_run",
        "last_run",
        "recent",
    )
    # "missed", "timezone" and "source" are filters and form fields, not columns: the list,
    # with its recent runs, must fit at 1280 px with the menu open (tests/test_admin_browser*),
    # and a schedule's own zone is shown under its times when it differs from the admin's.
    list_filter = ("enabled", "queue", "missed", "source", "timezone")
    search_fields = ("name", "queue", "cron")
    readonly_fields = (
        "source",
        "next_run_at",
        "last_run_at",
        "last_job_id",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("name", "queue", "enabled", "source")}),
        ("When", {"fields": ("cron", "interval", "timezone", "missed")}),
        ("Job", {"fields": ("payload", "job_options")}),
        (
            "State",
            {"fields": ("next_run_at", "last_run_at", "last_job_id", "created_at", "updated_at")},
        ),
    )
    actions = ("enable_schedules", "disable_schedules", "run_now")
    change_form_template = "admin/django_jobq/schedule/change_form.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        """A schedule declared in ``JOBQ["SCHEDULES"]`` says so on its page, and says when it
        was edited since the last sync: the next sync writes the settings back over it."""
        obj = self.get_object(request, object_id)
        if obj is not None and obj.source == SETTINGS and request.method == "GET":
            if is_drifted(obj):
                messages.warning(
                    request,
                    "Drift: this schedule was edited here since it was last synced from "
                    "JOBQ['SCHEDULES']. The next sync (the reaper, or jobq_schedules --sync) "
                    "writes the settings back: change the settings to keep an edit.",
                )
            else:
                messages.info(
                    request,
                    "This schedule is declared in JOBQ['SCHEDULES']: edits made here are "
                    "overwritten by the next sync.",
                )
        if obj is not None:
            extra_context = {**(extra_context or {}), "recent_runs": recent_runs(obj)}
        return super().change_view(request, object_id, form_url, extra_context)

    class Media:
        css = {"all": ["django_jobq/jobq.css"]}  # noqa: RUF012 - Django's Media declaration

    @admin.display(description="cron / interval")
    def timing(self, obj: Schedule) -> str:
        return describe(obj)

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        return _when_in_zones(obj.next_run_at, obj.timezone)

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str:
        return _when_in_zones(obj.last_run_at, obj.timezone)

    @admin.display(description="runs")
    def recent(self, obj: Schedule) -> str:
        """The last runs as one coloured mark each, newest first, linked to its job; the
        state, job id and run time in its tooltip (the table on the schedule's page has them
        written out). Marks, not words: the list must fit at 1366 px with the menu open."""
        runs = recent_runs(obj, RUNS_IN_LIST)
        if not runs:
            return "—"
        return format_html(
            '<span class="jobq-runs">{}</span>',
            format_html_join(
                "", '<a class="jobq-run jobq-state-{}" href="{}" title="{}: {}{}">{}</a>',
                ((r["state"], r["url"], r["job_id"], r["state"],
                  f", ran {r['duration']}" if r["duration"] else "", r["state"][:1].upper())
                 for r in runs),
            ),
        )  # fmt: skip

    @admin.action(description="Enable selected schedules", permissions=["change"])
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected schedules", permissions=["change"])
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[Schedule], enabled: bool
    ) -> None:
        changed = 0
        for schedule in queryset.filter(enabled=not enabled):
            schedule.enabled = enabled
            # save(), not update(): enabling again must recompute next_run_at (pre_save hook),
            # so ticks from while it was off do not fire as missed.
            schedule.save(update_fields=["enabled", "next_run_at", "updated_at"])
            changed += 1
        state = "enabled" if enabled else "disabled"
        self.message_user(request, f"{changed} schedule(s) {state}.", messages.SUCCESS)

    @admin.action(description="Run selected schedules now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            try:
                result = fire_now(schedule)
            except Exception as exc:  # refused options, or storage down: the class varies
                self.message_user(request, f"{schedule.name}: not enqueued: {exc}", messages.ERROR)
            else:
                link = reverse("admin:django_jobq_job_by_id", args=[schedule.queue, result.job_id])
                self.message_user(
                    request,
                    format_html(
                        '{}: enqueued <a href="{}">{}/{}</a>',
                        schedule.name, link, schedule.queue, result.job_id,
                    ),
                    messages.SUCCESS,
                )  # fmt: skip
