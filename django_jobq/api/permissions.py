"""Who may do what: API keys by their scopes, Django users by Django permissions.

Every view names the action it needs (``jobq_action``: enqueue, read or manage). A key needs
that action and, for a view on one queue, that queue; a list across queues is filtered to the
key's queues (``allowed_queues``), so a key scoped to queue A never sees a job of queue B."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import ApiKey

# A Django user (session, token or any project authentication) needs the permission on the
# Job model that matches the action; superusers have them all.
USER_PERMISSIONS = {
    ApiKey.Action.READ: "django_jobq.view_job",
    ApiKey.Action.ENQUEUE: "django_jobq.add_job",
    ApiKey.Action.MANAGE: "django_jobq.change_job",
}


def request_key(request: Request) -> ApiKey | None:
    return request.auth if isinstance(request.auth, ApiKey) else None


def allowed_queues(request: Request) -> set[str] | None:
    """The queues this request may see; None: every queue."""
    key = request_key(request)
    if key is None or "*" in key.queues:
        return None
    return set(key.queues)


def may_see_queue(request: Request, queue: str) -> bool:
    allowed = allowed_queues(request)
    return allowed is None or queue in allowed


class JobQPermission(BasePermission):
    message = "this credential may not do this"

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        action = view.jobq_action
        key = request_key(request)
        if key is None:
            return bool(request.user.has_perm(USER_PERMISSIONS[action]))
        if not key.allows_action(action):
            self.message = f"this API key lacks the {action!r} action"
            return False
        queue = view.kwargs.get("queue")
        if queue is not None and not key.allows_queue(queue):
            self.message = f"this API key is not scoped to queue {queue!r}"
            return False
        return True

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        queue = getattr(obj, "queue", None)
        return queue is None or may_see_queue(request, queue)
