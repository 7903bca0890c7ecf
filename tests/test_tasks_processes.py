"""Task functions served by a real ``manage.py runworker`` process: it serves the tasks' queue
(also when started without a queue list), runs each job type by name (thread and process pools), and
fails an unknown name for good while it keeps serving; on Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import os

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue

from .helpers import PROCESS_START, Spawner, wait_until
from .jobsapp.jobs import proc_add, proc_shout

pytestmark = pytest.mark.slow
Q = "tests-tasks"


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def backend(request):
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
    return request.param


@pytest.fixture
def spawn(backend, request, tmp_path):
    if backend == "redis":
        env = {"JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix"),
               "JOBQ_TEST_SQLITE": str(tmp_path / "subprocess.sqlite3")}  # fmt: skip
    else:
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": {"sqlite": "default", "postgres": "pg"}[backend],
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        }
    spawner = Spawner(tmp_path, env)
    yield spawner
    spawner.stop_all()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_runworker_serves_named_tasks_by_name(live_storage, spawn, pool):
    queue = Queue(Q, storage=live_storage)
    # The process pool is started without a queue list: it serves every registered queue,
    # the tasks' included (the thread pool cannot: tests/jobsapp has hard-timeout handlers).
    queues = (Q,) if pool == "thread" else ()
    spawn("runworker", *queues, "--pool", pool, "-c", "2", "--reap-interval", "0", log="worker")
    # Without a queue list the process also runs every @subscriber (a second registration,
    # its id ending "-subscribers"): wait for the job worker serving the tasks' queue.
    serving = lambda: any(Q in w.info.get("queues", []) for w in live_storage.list_workers())  # noqa: E731
    assert wait_until(serving, PROCESS_START), live_storage.list_workers()
    added = proc_add.using(queue=queue).enqueue(2, b=5)
    shouted = proc_shout.using(queue=queue).enqueue("hi")
    queue.enqueue("ghost", {"args": [], "kwargs": {}}, meta={"task": "tests.proc.nobody"})

    def done(job_id):
        status = queue.get_status(job_id)
        return status is not None and status.state in (JobState.COMPLETED, JobState.FAILED)

    assert wait_until(lambda: all(done(j) for j in (added.job_id, shouted.job_id, "ghost")))
    result = queue.get_result(added.job_id).value
    assert result["sum"] == 7 and result["pid"] != os.getpid()
    assert queue.get_result(shouted.job_id).value == "HI"
    ghost = queue.get_status("ghost")
    assert ghost.state is JobState.FAILED and ghost.error["type"] == "UnknownTask"
    # The worker is still serving after the unknown name.
    assert proc_add.using(queue=queue).enqueue_and_wait(1, wait_timeout=60)["sum"] == 1
