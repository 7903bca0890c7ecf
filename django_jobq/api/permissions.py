"""Who may do what: API keys by their scopes, Django users by Django permissions.

Every view names the operation it performs (``jobq_operation``, from ``django_jobq.permissions``).
A key needs the action the operation belongs to (enqueue, read or manage) and, for a view on
one queue, that queue; a list across queues is filtered to the key's queues
(``allowed_queues``), so a key scoped to queue A never sees a job of queue B. A Django user
needs the permission the admin asks for the same operation (one map for both)."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import ApiKey
from ..permissions import API_ACTIONS, PERMISSIONS, READ, user_may


def request_key(request: Request) -> ApiKey | None:
    return request.auth if isinstance(request.auth, ApiKey) else None


def may(request: Request, operation: str) -> bool:
    """Whether this credential may perform ``operation`` (its key's action, or the permission
    the admin asks for the same operation), for a view that needs more than its own
    ``jobq_operation`` for some requests."""
    key = request_key(request)
    if key is None:
        return user_may(request.user, operation)
    return bool(key.allows_action(API_ACTIONS[operation]))


def may_read(request: Request) -> bool:
    """Whether this credential may read jobs (a re-enqueue answers with the job's state)."""
    return may(request, READ)


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
        operation = view.jobq_operation
        key = request_key(request)
        if key is None:
            if user_may(request.user, operation):
                return True
            self.message = f"this user lacks the {PERMISSIONS[operation]!r} permission"
            return False
        action = API_ACTIONS[operation]
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
