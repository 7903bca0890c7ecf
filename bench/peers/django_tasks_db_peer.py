"""Django's Tasks framework with the ``django-tasks-db`` database backend (PostgreSQL): the
peer a Django project gets without any server beyond its database, like django_jobq's
database backend.

Most favourable reasonable settings, and why:
- ``db_worker --interval 0.01``: the worker polls for tasks (it has no wake-up signal); the
  default is 1 s, which would make every request/response wait half a second on average;
  10 ms is the shortest poll one would run in production;
- ``--no-startup-delay``: the worker starts polling at once;
- drain: one ``db_worker`` process (it runs one task at a time);
- request/response: ``TaskResult.refresh()`` every 1 ms until the task finished (the framework
  has no blocking wait);
- bulk: none, the framework has no bulk enqueue ("n/a"); the drain's jobs are enqueued inside
  one ``transaction.atomic()`` (one commit), which is how a caller would batch them.

Django is configured here (``settings.configure``) with this app's own PostgreSQL database,
migrated on first use and emptied before each workload.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version

import django
from django.conf import settings

from bench.peers.common import QUEUE, Adapter, probe_record
from bench.peers.pg import ANALYZE_AFTER_FILL, conninfo

ENQ_QUEUE = "peerbench-enq"
INTERVAL = "0.01"


def _configure() -> None:
    if settings.configured:
        return
    params = dict(item.split("=", 1) for item in conninfo("django_tasks_db").split())
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params["dbname"],
                "USER": params["user"],
                "HOST": params["host"],
            }
        },
        INSTALLED_APPS=["django_tasks_db"],
        TASKS={
            "default": {
                "BACKEND": "django_tasks_db.DatabaseBackend",
                "QUEUES": [QUEUE, ENQ_QUEUE],
            }
        },
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING={"version": 1, "disable_existing_loggers": False},
    )
    django.setup()


_configure()

from django.tasks import task  # noqa: E402 (needs the settings above)


@task(queue_name=QUEUE)
def noop(n: int) -> None:
    probe_record()


def make_adapter() -> Adapter:
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.tasks import TaskResultStatus

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_tasks_database_dbtaskresult")
    enq = noop.using(queue_name=ENQ_QUEUE)

    def enqueue_one(n: int) -> None:
        for i in range(n):
            enq.enqueue(n=i)

    def fill(n: int) -> None:
        with transaction.atomic():
            for i in range(n):
                noop.enqueue(n=i)
        with connection.cursor() as cursor:
            cursor.execute(ANALYZE_AFTER_FILL)  # as autovacuum would (see pg.py)

    def worker_command(role: str) -> list[str]:
        return [sys.executable, "-m", "bench.peers.common", "django_tasks_db", "worker", role]

    def rr_call() -> None:
        result = noop.enqueue(n=0)
        deadline = time.monotonic() + 10
        while True:
            result.refresh()
            if result.status == TaskResultStatus.SUCCESSFUL:
                return
            if result.status == TaskResultStatus.FAILED or time.monotonic() > deadline:
                raise RuntimeError(f"django-tasks-db task ended {result.status}")
            time.sleep(0.001)

    return Adapter(
        name="Django Tasks (django-tasks-db)",
        version=version("django-tasks-db"),
        settings={
            "worker": f"db_worker --interval {INTERVAL} --no-startup-delay, one process",
            "rr_wait": "TaskResult.refresh() every 1 ms (no blocking wait)",
            "fill": "Task.enqueue in one transaction.atomic()",
            "django": version("django"),
        },
        enqueue_one=enqueue_one,
        enqueue_bulk=None,
        fill=fill,
        worker_command=worker_command,
        rr_call=rr_call,
        not_available={"enqueue_bulk": "Django Tasks has no bulk enqueue"},
    )


def run_worker(role: str) -> None:
    from django.core.management import call_command

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    call_command(
        "db_worker", queue_name=QUEUE, interval=float(INTERVAL), startup_delay=False, verbosity=0
    )
