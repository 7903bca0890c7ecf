"""The django-jobq admin: queues overview with charts, jobs, workers and schedules.

Every change an operator makes goes through the Queue API (so Redis and the mirror agree);
the pages only read rows and live storage figures. See docs/admin.md.
"""

from django.contrib import admin

from ..api import admin as api_admin  # noqa: F401 - registers the ApiKey admin (no DRF needed)
from ..models import BroadcastLog, Job, MirrorReject, QueueConfig, WorkerInfo
from .broadcasts import BroadcastAdmin
from .failures import TriageQueueAdmin
from .jobs import JobAdmin
from .queues import QueueAdmin
from .rejects import MirrorRejectAdmin
from .schedules import ScheduleAdmin, ScheduleForm
from .workers import WorkerAdmin

admin.site.register(Job, JobAdmin)
admin.site.register(QueueConfig, TriageQueueAdmin)  # QueueAdmin + the failures pages
admin.site.register(WorkerInfo, WorkerAdmin)
admin.site.register(MirrorReject, MirrorRejectAdmin)
admin.site.register(BroadcastLog, BroadcastAdmin)

__all__ = [
    "BroadcastAdmin",
    "JobAdmin",
    "MirrorRejectAdmin",
    "QueueAdmin",
    "ScheduleAdmin",
    "ScheduleForm",
    "WorkerAdmin",
]
