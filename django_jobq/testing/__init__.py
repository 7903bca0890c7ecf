"""Testing code that enqueues jobs: capture them, run them in-process on demand.

``jobq_test_mode()`` (context manager or decorator) and the ``jobq`` pytest fixture (the
``django_jobq.testing.pytest_plugin`` plugin, registered when django-jobq is installed) put
every queue of the project on one in-memory storage with a test clock; enqueues go through the
production validation and serialiser, and ``run_all()`` runs jobs with the worker's rules.
See docs/testing.md.

The names load lazily: pytest imports the plugin (and so this package) in every session of an
environment where django-jobq is installed, before Django is set up, and that must cost nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .mode import JobQTestMode, jobq_test_mode
    from .runner import JobRunError, Run
    from .storage import EnqueuedJob, TestClock

_WHERE = {
    "JobQTestMode": "mode", "jobq_test_mode": "mode", "JobRunError": "runner", "Run": "runner",
    "EnqueuedJob": "storage", "TestClock": "storage",
}  # fmt: skip
__all__ = ["EnqueuedJob", "JobQTestMode", "JobRunError", "Run", "TestClock", "jobq_test_mode"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(name)
