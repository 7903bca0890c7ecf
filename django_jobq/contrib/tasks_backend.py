"""A backend for Django's Tasks framework (``django.tasks``) that runs tasks on django_jobq.

    TASKS = {"default": {
        "BACKEND": "django_jobq.contrib.tasks_backend.JobQBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"JOB_OPTIONS": {"max_attempts": 5},    # optional
                    "ATOMIC": True},    # optional: each task's writes commit with its job
    }}

Why: a project written against ``django.tasks`` (``@task`` … ``.enqueue()``) gets our leases,
retries with backoff, stalled-job recovery and cached results without changing a line, and can
still use the Queue API where it needs more (ids, dedup, request/response).

How a task runs: ``enqueue`` puts a job on the django_jobq queue named ``task.queue_name`` whose
payload names the task by module path, with its JSON arguments. The backend registers
``run_task`` as the handler of each of its ``QUEUES``, so ``manage.py runworker`` serves them.
``run_task`` only ever calls a ``django.tasks.Task`` the project declared on this backend alias,
found by path in ``DECLARED`` (every ``Task`` passes ``validate_task`` when it is defined), never
by importing the name a message gives: importing a module runs its code, and anyone who may
enqueue (an enqueue-only API key) chooses that name. A worker that meets a path it has not
seen imports the ``tasks`` module of each installed app once (Django's convention), then looks
again; a task defined elsewhere must be imported by the project (``AppConfig.ready``, or the
app's ``jobs`` module, which django_jobq autodiscovers). Anything else fails permanently.

Mappings: Django priority −100…100 runs *higher* first, ours runs *lower* first, so ours is the
negation. ``run_after`` becomes ``run_at``. The result id is ``"<queue>/<job id>"`` (our ids are
unique per queue). States: waiting ones → READY, active → RUNNING, completed → SUCCESSFUL,
failed and cancelled → FAILED.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import autodiscover_modules, import_string

from ..backend import get_storage
from ..errors import JobQError, PermanentError
from ..job import Job, ms_to_datetime
from ..queue.core import Queue
from ..states import WAITING_STATES, JobState
from ..tasks.registry import registry
from ..validation import validate_job_id

STATUS = {
    JobState.ACTIVE: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
    **dict.fromkeys(WAITING_STATES, TaskResultStatus.READY),
    JobState.RETRYING: TaskResultStatus.READY,
}
WORKER_ID = f"{socket.gethostname()}-{os.getpid()}"
#: Every Task defined on a JobQBackend in this process, by ``module_path`` (module docstring).
DECLARED: dict[str, Task] = {}
_discovered = False


class JobQBackend(BaseTaskBackend):
    supports_defer = True  # run_after -> run_at
    supports_async_task = True  # async def tasks run to completion in the worker thread
    supports_get_result = True  # from any process: results live in the queue's storage
    supports_priority = True  # mapped onto our priorities (negated)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        storage = self.options.get("STORAGE")
        self._storage = import_string(storage)() if isinstance(storage, str) else storage
        self.job_options: dict[str, Any] = dict(self.options.get("JOB_OPTIONS", {}))
        self._queues: dict[str, Queue] = {}
        # ATOMIC: every task of these queues runs as an ``atomic=True`` handler (its database
        # writes and its job's completion in one transaction; plain ``def`` tasks: an async
        # task's ORM calls run on other threads, outside it).
        atomic = self.options.get("ATOMIC", False)
        for name in self.queues:
            registry.register(name, run_task, atomic=atomic)  # a project handler: refused

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        DECLARED[task.module_path] = task

    def queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        # Without a STORAGE option the queue follows the JOBQ setting, rebuilt when it selects
        # another storage (override_settings, the test mode), as get_queue() does.
        if q is None or (self._storage is None and q.storage is not get_storage()):
            q = self._queues[name] = Queue(name, storage=self._storage)
        return q

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        try:
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except TypeError as exc:
            raise InvalidTask(f"task arguments must be JSON-serialisable: {exc}") from exc
        payload = {"task": task.module_path, "backend": self.alias, "args": args,
                   "kwargs": kwargs}  # fmt: skip
        try:
            stored = self.queue(task.queue_name).enqueue(
                None, payload, priority=-task.priority, run_at=task.run_after, **self.job_options
            )
        except JobQError as exc:
            raise InvalidTask(str(exc)) from exc
        result: TaskResult = TaskResult(
            task=task, id=f"{task.queue_name}/{stored.job_id}", status=TaskResultStatus.READY,
            enqueued_at=timezone.now(), started_at=None, finished_at=None,
            last_attempted_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[],
        )  # fmt: skip
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        queue_name, _, job_id = str(result_id).partition("/")
        if not job_id or queue_name not in self.queues:
            raise TaskResultDoesNotExist(result_id)
        try:  # validated like every id at our edge: nothing odd reaches a storage key
            home = self.queue(queue_name).locate(validate_job_id(job_id))  # sharded: its partition
            record = home.storage.get_record(home.name, job_id)
        except JobQError as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        if record is None or record.payload is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            payload = json.loads(record.payload)
            found = _task(payload, self.alias)
        except (ValueError, TypeError, AttributeError, PermanentError) as exc:
            raise TaskResultDoesNotExist(result_id) from exc  # a job, but not one of our tasks
        task = found.using(queue_name=queue_name, priority=-record.priority, backend=self.alias)
        errors = []
        if record.error is not None and record.state is not JobState.COMPLETED:
            err = json.loads(record.error)
            errors.append(TaskError(exception_class_path=err.get("type", "Exception"),
                                    traceback=err.get("traceback", "")))  # fmt: skip
        result: TaskResult = TaskResult(
            task=task, id=result_id, status=STATUS[record.state],
            enqueued_at=ms_to_datetime(record.created_at),
            started_at=ms_to_datetime(record.started_at),
            finished_at=ms_to_datetime(record.finished_at),
            last_attempted_at=ms_to_datetime(record.started_at),
            args=payload["args"], kwargs=payload["kwargs"], backend=self.alias, errors=errors,
            # We keep the last worker, not one per attempt: repeat it so .attempts is right.
            worker_ids=[record.worker or ""] * record.attempts,
        )  # fmt: skip
        if record.state is JobState.COMPLETED and record.result is not None:
            object.__setattr__(result, "_return_value", json.loads(record.result))
        return result


def _task(payload: dict[str, Any], alias: str) -> Task:
    """The Task a payload names, refusing anything that is not a Task of this backend."""
    global _discovered
    path = payload.get("task")
    obj = DECLARED.get(path) if isinstance(path, str) else None
    if obj is None and not _discovered:
        _discovered = True
        autodiscover_modules("tasks")  # the project's own modules, never the message's
        obj = DECLARED.get(path) if isinstance(path, str) else None
    if obj is None:
        raise PermanentError(
            f"{path!r} is not a django.tasks Task this project declared (tasks "
            "are found among the ones imported, never imported by name)"
        )
    if obj.backend != alias:
        raise PermanentError(f"{path!r} is not a django.tasks Task of backend {alias!r}")
    return obj


def run_task(job: Job) -> Any:
    """The handler of every queue a JobQBackend serves."""
    payload = job.payload
    if not isinstance(payload, dict) or not {"task", "backend", "args", "kwargs"} <= set(payload):
        raise PermanentError("not a django.tasks payload")
    task = _task(payload, payload["backend"]).using(queue_name=job.queue)
    now = timezone.now()
    result: TaskResult = TaskResult(
        task=task, id=f"{job.queue}/{job.id}", status=TaskResultStatus.RUNNING,
        enqueued_at=None, started_at=now, finished_at=None, last_attempted_at=now,
        args=payload["args"], kwargs=payload["kwargs"], backend=payload["backend"], errors=[],
        worker_ids=[WORKER_ID] * job.attempt,
    )  # fmt: skip
    sender = type(task.get_backend())
    task_started.send(sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except BaseException as exc:
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        kind = type(exc)
        result.errors.append(TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                                       traceback=""))  # fmt: skip
        task_finished.send(sender, task_result=result)
        raise  # our retry policy decides what happens next
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender, task_result=result)
    return value


def register_task_queues() -> None:
    """Instantiate the configured JobQBackends so their queues get ``run_task`` as handler
    before a worker starts (Django builds task backends lazily, on first use)."""
    from django.conf import settings
    from django.tasks import task_backends

    for alias, conf in getattr(settings, "TASKS", {}).items():
        if str(conf.get("BACKEND", "")).endswith("tasks_backend.JobQBackend"):
            task_backends[alias]
