"""Jobs the Redis mirror set aside because the database refused their rows: read-only rows
an operator can look at and delete once understood (deleting changes nothing in Redis)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class MirrorRejectAdmin(admin.ModelAdmin):
    list_display = ("queue", "job_id", "error", "events", "first_seen", "last_seen")
    list_filter = ("queue",)
    search_fields = ("job_id",)
    ordering = ("-last_seen",)
    readonly_fields = (
        "queue", "job_id", "stream_id", "kind", "error", "events", "first_seen", "last_seen",
    )  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
