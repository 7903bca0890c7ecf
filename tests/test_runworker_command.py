"""``runworker`` start-up: Django's system checks are opt-in (``--check``), so a worker's time
from spawn to its first claim is not spent importing the project's URLconf."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import execute_from_command_line


@pytest.fixture
def failing_check():
    def broken(app_configs, **kwargs):
        return [checks.Error("broken on purpose", id="tests.E999")]

    checks.register(broken, "tests")
    yield
    checks.registry.registry.registered_checks.discard(broken)


def run_as_manage_py(*args: str) -> None:
    """The command line path of ``manage.py runworker ...`` (where checks run, unlike
    call_command); the invalid queue name makes the worker stop before it serves anything."""
    with pytest.raises(SystemExit) as exited:
        execute_from_command_line(["manage.py", "runworker", *args])
    assert exited.value.code == 1


def test_system_checks_do_not_run_by_default(failing_check, capsys):
    run_as_manage_py("not a queue!")
    err = capsys.readouterr().err
    assert "broken on purpose" not in err
    assert "queue" in err.lower()


@pytest.mark.django_db
def test_check_flag_runs_the_system_checks_first(failing_check, capsys):
    run_as_manage_py("not a queue!", "--check")
    err = capsys.readouterr().err
    assert "broken on purpose" in err
