"""Admin for periodic schedules. The form runs the same validation as the reaper relies on, so
a bad cron, time zone or job option is refused next to its field instead of failing silently
at every sweep."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .api import admin as api_admin  # noqa: F401 - registers the ApiKey admin
from .models import Schedule
from .schedules import describe, fire_now, validate_schedule


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


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = (
        "name",
        "queue",
        "timing",
        "timezone",
        "enabled",
        "missed",
        "next_run_at",
        "last_run_at",
    )
    list_filter = ("enabled", "queue", "missed", "timezone")
    search_fields = ("name", "queue", "cron")
    readonly_fields = ("next_run_at", "last_run_at", "last_job_id", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "queue", "enabled")}),
        ("When", {"fields": ("cron", "interval", "timezone", "missed")}),
        ("Job", {"fields": ("payload", "job_options")}),
        (
            "State",
            {"fields": ("next_run_at", "last_run_at", "last_job_id", "created_at", "updated_at")},
        ),
    )
    actions = ("enable_schedules", "disable_schedules", "run_now")

    @admin.display(description="cron / interval")
    def timing(self, obj: Schedule) -> str:
        return describe(obj)

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
                self.message_user(
                    request,
                    f"{schedule.name}: enqueued {schedule.queue}/{result.job_id}",
                    messages.SUCCESS,
                )
