"""Task failure handlers and canvas handles under a real ``manage.py runworker`` process, on
Redis, SQLite and PostgreSQL: a task routed to another queue by ``JOBQ["ROUTES"]`` tells its
own failure handler in the worker process, and ``get`` on a chain, group and chord returns
(or names the failed member) while the worker runs them."""

from __future__ import annotations

import json
import os

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue
from django_jobq.tasks import CanvasFailed, chain, chord, group

from .helpers import PROCESS_START, Spawner, wait_until
from .jobsapp.jobs import proc_doomed, proc_inc, proc_total

pytestmark = pytest.mark.slow
Q = "tests-tasks"
ROUTED = "tests-tasks-routed"
PATIENCE = 60.0


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def backend(request):
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
    elif request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
    return request.param


@pytest.fixture
def spawn(backend, request, tmp_path):
    routes = {"JOBQ_TEST_ROUTES": json.dumps({proc_doomed.name: ROUTED})}
    if backend == "redis":
        env = {"JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix"),
               "JOBQ_TEST_SQLITE": str(tmp_path / "subprocess.sqlite3"), **routes}  # fmt: skip
    else:
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": {"sqlite": "default", "postgres": "pg"}[backend],
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
            **routes,
        }
    spawner = Spawner(tmp_path, env)
    yield spawner
    spawner.stop_all()


def serving(storage, queue: str):
    return lambda: any(queue in w.info.get("queues", []) for w in storage.list_workers())


def test_a_routed_tasks_failure_handler_runs_in_the_worker_process(
    live_storage, spawn, tmp_path, settings
):
    settings.JOBQ = {**settings.JOBQ, "ROUTES": {proc_doomed.name: ROUTED}}
    spawn("runworker", ROUTED, "--reap-interval", "0", log="worker")
    assert wait_until(serving(live_storage, ROUTED), PROCESS_START), live_storage.list_workers()
    assert live_storage.failure_hook(ROUTED)  # the worker turned the routed queue's hook on
    queue = Queue(ROUTED, storage=live_storage)
    ledger = tmp_path / "ledger.txt"
    # The payload as proc_doomed.enqueue would send it, on this test's storage and the route.
    payload = proc_doomed.payload((str(ledger), 7), {})
    queue.enqueue("doomed-7", payload, meta={"task": proc_doomed.name})
    told = lambda: ledger.read_text().split() if ledger.exists() else []  # noqa: E731
    assert wait_until(lambda: len(told()) == 6, PATIENCE), told()
    kind, task_name, job_id, n, error_type, pid = told()
    assert (kind, task_name, job_id, n) == ("told", "tests.proc.doomed", "doomed-7", "7")
    assert error_type == "builtins.ValueError" and int(pid) != os.getpid()
    assert queue.get_status("doomed-7").state is JobState.FAILED
    assert wait_until(lambda: queue.count_failure_calls() == 0)


def test_canvas_handles_wait_on_a_runworker_process(live_storage, spawn):
    spawn("runworker", Q, "-c", "2", "--reap-interval", "0", log="worker")
    assert wait_until(serving(live_storage, Q), PROCESS_START), live_storage.list_workers()
    queue = Queue(Q, storage=live_storage)
    i, t = proc_inc.using(queue=queue), proc_total.using(queue=queue)
    assert (i.s(1) | i.s() | i.s()).enqueue().get(PATIENCE) == 4
    assert group(i.s(1), i.s(2)).enqueue().get(PATIENCE) == [2, 3]
    handle = chord(group(i.s(1), i.s(2), i.s(3)), t.s()).enqueue()
    assert handle.get(PATIENCE) == 9 and handle.status().state == "completed"
    with pytest.raises(CanvasFailed, match="step 2 of 3") as caught:
        chain(i.s(1), i.s(fail=True), i.s()).enqueue_and_wait(timeout=PATIENCE)
    assert caught.value.task == "tests.proc.inc" and "inc(2) told to fail" in str(caught.value)
