"""The example project's task-function demo (a migrated Celery app) runs end to end as a user
would run it: migrate, then ``manage.py jobq_tasks_demo`` with its own worker process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_the_tasks_demo_runs(tmp_path, backend):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    env.pop("JOBQ_REDIS_URL", None)
    if backend == "redis":
        env["JOBQ_REDIS_URL"] = os.environ.get("JOBQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300)
    done = subprocess.run([*manage, "jobq_tasks_demo"], cwd=ROOT, env=env, timeout=600,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tasks demo done" in done.stdout
    assert "refused at the caller" in done.stdout
