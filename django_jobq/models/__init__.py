"""Django models of the app (one module per concept); every model is importable from here
(``from django_jobq.models import Job``), as Django and the migrations expect.

With the database backend the job rows *are* the state; with Redis they are a read-only mirror
(``jobs.py``)."""
# ruff: noqa: F401 - the re-exports are the point of this module

from .analytics import ExportWatermark, QueueMetric
from .api import ApiKey, IdempotencyRecord
from .broadcasts import BroadcastDelivery, BroadcastGroup, BroadcastLog, BroadcastMessage
from .jobs import (
    ClaimLog,
    DedupKey,
    EventFloor,
    FailureCall,
    Job,
    JobEvent,
    JobOutcome,
    JobQuerySet,
    JournalEntry,
    QueueConfig,
    StateCount,
    WorkerInfo,
)
from .mirror import JobMinute, MirrorReject, RollupMark
from .schedules import Schedule
