"""Testing code that enqueues jobs: capture them, run them in-process on demand.

``jobq_test_mode()`` (context manager or decorator) and the ``jobq`` pytest fixture (the
``django_jobq.testing.pytest_plugin`` plugin, registered when django-jobq is installed) put
every queue of the project on one in-memory storage with a test clock; enqueues go through the
production validation and serialiser, and ``run_all()`` runs jobs with the worker's rules.
See docs/testing.md.
"""

from .mode import JobQTestMode, jobq_test_mode
from .runner import JobRunError, Run
from .storage import EnqueuedJob, TestClock

__all__ = ["EnqueuedJob", "JobQTestMode", "JobRunError", "Run", "TestClock", "jobq_test_mode"]
