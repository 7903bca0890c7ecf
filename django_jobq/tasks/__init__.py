"""Task functions: named job types declared with ``@task`` (see ``core.py``), their retry
policies (``policy.py``), chain / group / chord (``canvas.py``) and their handles
(``results.py``); and the registry of what runs each job (``registry.py``: handlers by queue,
tasks by name), which imports no queue and no storage, so the storage builder may read it."""

from .canvas import chain, chord, group
from .core import Task, task
from .policy import Backoff, RetryPolicy
from .results import CanvasFailed, CanvasResult, CanvasStatus, CanvasTimeout, GroupResult

__all__ = [
    "Backoff",
    "CanvasFailed",
    "CanvasResult",
    "CanvasStatus",
    "CanvasTimeout",
    "GroupResult",
    "RetryPolicy",
    "Task",
    "chain",
    "chord",
    "group",
    "task",
]
