"""Which Django permission each operator operation needs: one map, asked by the admin and by
the REST API alike, so a user can do the same things on both (before, cancelling needed
``cancel_job`` in the admin but ``change_job`` over the API).

API keys are scoped by their own three actions (enqueue, read, manage); ``API_ACTIONS`` says
which action each operation belongs to. A Django user is asked for the permission below."""

from __future__ import annotations

from typing import Any

READ = "read"
ENQUEUE = "enqueue"
CANCEL = "cancel"
RETRY = "retry"
CHANGE = "change"  # run now, change priority
DELETE = "delete"
PAUSE = "pause"  # pause and resume a queue
SCHEDULE_READ = "schedule_read"
SCHEDULE_ADD = "schedule_add"
SCHEDULE_CHANGE = "schedule_change"  # edit, enable, disable, run now
SCHEDULE_DELETE = "schedule_delete"

PERMISSIONS: dict[str, str] = {
    READ: "django_jobq.view_job",
    ENQUEUE: "django_jobq.add_job",
    CANCEL: "django_jobq.cancel_job",
    RETRY: "django_jobq.retry_job",
    CHANGE: "django_jobq.change_job",
    DELETE: "django_jobq.delete_job",
    PAUSE: "django_jobq.change_queueconfig",
    SCHEDULE_READ: "django_jobq.view_schedule",
    SCHEDULE_ADD: "django_jobq.add_schedule",
    SCHEDULE_CHANGE: "django_jobq.change_schedule",
    SCHEDULE_DELETE: "django_jobq.delete_schedule",
}

# Django's admin lets "change" imply "view"; the API does the same, so one user sees the same
# jobs and schedules in both.
_IMPLIED_BY = {
    READ: "django_jobq.change_job",
    SCHEDULE_READ: "django_jobq.change_schedule",
}

API_ACTIONS: dict[str, str] = {
    READ: "read",
    SCHEDULE_READ: "read",
    ENQUEUE: "enqueue",
    **{op: "manage" for op in (CANCEL, RETRY, CHANGE, DELETE, PAUSE, SCHEDULE_ADD,
                               SCHEDULE_CHANGE, SCHEDULE_DELETE)},
}  # fmt: skip


def user_may(user: Any, operation: str) -> bool:
    """True when the Django ``user`` has the permission ``operation`` needs."""
    if user.has_perm(PERMISSIONS[operation]):
        return True
    implied = _IMPLIED_BY.get(operation)
    return implied is not None and bool(user.has_perm(implied))
