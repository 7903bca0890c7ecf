"""Task functions: named job types declared with ``@task`` (see ``core.py``), their retry
policies (``policy.py``), chain / group / chord (``canvas.py``) and their handles
(``results.py``); and the registry of what runs each job (``registry.py``: handlers by queue,
tasks by name).

The names below load on first use: the registry and the policies sit under the Queue API
(the storage builder reads handler names from the registry), while the task functions enqueue
through it, so importing the registry must not import them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .canvas import chain, chord, group
    from .core import Task, task
    from .policy import Backoff, RetryPolicy
    from .results import CanvasFailed, CanvasResult, CanvasStatus, CanvasTimeout, GroupResult

_EXPORTS = {
    "Backoff": "policy",
    "CanvasFailed": "results",
    "CanvasResult": "results",
    "CanvasStatus": "results",
    "CanvasTimeout": "results",
    "GroupResult": "results",
    "RetryPolicy": "policy",
    "Task": "core",
    "chain": "canvas",
    "chord": "canvas",
    "group": "canvas",
    "task": "core",
}
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
