"""The broadcasts page (the admin's "Broadcasts" entry): every broadcast with, per subscriber
group, its lag, pending, dead and missed counts, read live from the storage (Redis streams or
the database tables alike), and a group's dead letters with retry and purge buttons.

A group whose ``missed`` count is above zero fell behind the retention: messages were dropped
before it handled them. The page marks it, since nothing else would tell an operator.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from ..broadcast.core import Broadcast, broadcast_names
from ..errors import UnknownGroup, ValidationError
from ..job import ms_to_datetime

DEAD_SHOWN = 100


def overview(names: list[str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Broadcasts as dicts for the template, and the storage error if it failed."""
    try:
        out = []
        for name in names if names is not None else broadcast_names():
            bc = Broadcast(name)
            out.append({"name": name, "length": bc.length(), "groups": bc.status()})
        return out, None
    except Exception as exc:  # storage unreachable: the page says so instead of failing
        return [], f"{type(exc).__name__}: {exc}"


class BroadcastAdmin(admin.ModelAdmin):
    """The BroadcastLog model's admin entry opens the live broadcasts page."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.list_view), name="django_jobq_broadcastlog_changelist"),
            path("<str:name>/<str:group>/", wrap(self.group_view),
                 name="django_jobq_broadcast_group"),
            path("<str:name>/<str:group>/<str:action>/", wrap(self.dead_action),
                 name="django_jobq_broadcast_dead"),
        ]  # fmt: skip

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "title": title,
                "opts": self.model._meta, **extra}  # fmt: skip

    def list_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        broadcasts, error = overview()
        context = self._context(request, "Broadcasts", broadcasts=broadcasts, error=error)
        return TemplateResponse(request, "admin/django_jobq/broadcasts/list.html", context)

    def _group(self, name: str, group: str) -> Broadcast:
        try:
            bc = Broadcast(name)
        except ValidationError as exc:
            raise Http404(str(exc)) from exc
        if group not in {s.group for s in bc.status()}:
            raise Http404(str(UnknownGroup(name, group)))
        return bc

    def group_view(self, request: HttpRequest, name: str, group: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        bc = self._group(name, group)
        status = next(s for s in bc.status() if s.group == group)
        dead = [{
            "position": d.position, "message_id": d.message_id, "attempts": d.attempts,
            "published_at": ms_to_datetime(d.published_at),
            "failed_at": ms_to_datetime(d.failed_at), "error": _error(d.error),
            "payload": d.payload.decode(errors="replace")[:500],
        } for d in bc.dead_letters(group, DEAD_SHOWN)]  # fmt: skip
        context = self._context(
            request, f"{name} · {group}", name=name, group=group, status=status, dead=dead,
            can_change=self.has_change_permission(request),
        )  # fmt: skip
        return TemplateResponse(request, "admin/django_jobq/broadcasts/group.html", context)

    def dead_action(self, request: HttpRequest, name: str, group: str, action: str) -> HttpResponse:
        if request.method != "POST" or action not in ("retry", "purge"):
            raise Http404("retry or purge, by POST")
        if not self.has_change_permission(request):
            raise PermissionDenied
        bc = self._group(name, group)
        if action == "retry":
            count = bc.retry_dead(group)
            messages.success(request, f"{count} dead letters of {group} will run again.")
        else:
            count = bc.purge_dead(group)
            messages.success(request, f"{count} dead letters of {group} deleted.")
        return HttpResponseRedirect(reverse("admin:django_jobq_broadcast_group",
                                            args=[name, group]))  # fmt: skip


def _error(body: bytes) -> str:
    try:
        record = json.loads(body)
        return f"{record.get('type', '')}: {record.get('message', '')}"
    except (TypeError, ValueError, AttributeError):
        return body.decode(errors="replace")[:500]
