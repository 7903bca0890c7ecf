"""Small helpers shared by test modules (polling for an observation, managed subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


# How long a test waits for something that a working implementation makes happen. Only a broken
# one hits it: a shared, loaded 2-core machine must never (a test decides on events, not speed).
PATIENCE = 30.0
# How long a test waits for separate processes (runworker, runreaper) to start serving: several
# Django start-ups at once on a machine whose cores are busy took more than PATIENCE.
PROCESS_START = 120.0


def worker_ports(ports: range) -> range:
    """This xdist worker's own slice of a test port range. A test that restarts its private
    Redis frees the port for a moment; another worker scanning the same range from its start
    took it then (a CI run failed so). Slices never overlap, so a freed port stays ours."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = len(ports) // max(count, 1)
    if size < 1 or index >= count:
        raise RuntimeError(f"{ports} is too small for {count} xdist workers")
    start = ports.start + index * size
    return range(start, start + size)


# Ports of the HTTP servers tests start (runserver, uvicorn); each xdist worker takes its slice.
_sfirst, _, _slast = os.environ.get("JOBQ_TEST_SERVER_PORTS", "7600-7699").partition("-")
SERVER_PORTS = range(int(_sfirst), int(_slast) + 1)


def listening_sockets(port: int) -> set[str]:
    """The ``socket:[inode]`` names of the TCP listeners on ``port`` (this network namespace)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a listener on ``port``. A server answering on the
    port is not proof that it is the one a test started: another process (another xdist
    worker's server) can take a port between the pick and the bind, and the test then talks
    to a server of another database (CI saw a 401 for a key just created so)."""
    sockets = listening_sockets(port)
    if not sockets:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in sockets:
                return True
        except OSError:
            continue
    return False


def bindable(port: int) -> bool:
    """Whether a server could bind ``port`` on loopback now, probed as servers bind
    (SO_REUSEADDR): a port a stopped server left connections in TIME_WAIT on is free for the
    next one (without the option, quick starts and stops used a whole range up for a
    minute)."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_server(
    start: Callable[[int], subprocess.Popen], what: str
) -> tuple[subprocess.Popen, int]:
    """Start an HTTP server with ``start(port)`` on a port of this xdist worker's share of
    ``SERVER_PORTS`` and return it once *it* listens there. A port someone else holds, or
    takes before the server binds it, makes the server exit: the next port is tried."""
    for port in filter(bindable, worker_ports(SERVER_PORTS)):
        proc = start(port)
        wait_until(lambda p=proc, n=port: p.poll() is not None or listens(p.pid, n), PROCESS_START)
        if listens(proc.pid, port):
            return proc, port
        log = getattr(proc, "log_path", None)
        text = Path(log).read_text() if log else ""
        if proc.poll() is None:
            raise AssertionError(f"{what} neither listens on {port} nor exits:\n{text[-3000:]}")
        if "in use" not in text:
            raise AssertionError(f"{what} exited ({proc.returncode}):\n{text[-3000:]}")
    raise RuntimeError(f"no port of {worker_ports(SERVER_PORTS)} left for {what}")


def wait_until(predicate, timeout: float = PATIENCE, interval: float = 0.01) -> bool:
    """Bounded polling for test observations (never used by the product): returns as soon as
    ``predicate()`` holds, so a generous ``timeout`` costs a passing test nothing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def up_listener(storage: Any) -> Any:
    """A database storage's wake-up thread, started and connected (PostgreSQL: LISTEN is on;
    SQLite: the watcher has read its first ``data_version``)."""
    storage._ensure_listener()
    listener = storage._listener
    assert listener is not None and listener.ready.is_set()
    return listener


def listen_session_open(pid: int | None) -> bool:
    """Whether PostgreSQL still lists the server process ``pid`` (a LISTEN connection's)."""
    from django.db import connections

    assert pid is not None
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] == 1


def log_tail(path: str | Path, lines: int = 40) -> str:
    """The end of a spawned process's log, for an assertion message: CI keeps the test output,
    not the temporary directory the log was written to."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text[-lines:])


class Spawner:
    """Starts ``manage.py`` commands with the test settings, each logging to its own file, and
    stops every one it started by PID (never by name): SIGTERM, then SIGKILL if it hangs."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.procs: list[subprocess.Popen] = []

    def argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, str(ROOT / "manage.py"), *args, "--settings", "tests.settings"]

    def __call__(self, *args: str, log: str = "proc") -> subprocess.Popen:
        out = (self.log_dir / f"{log}-{len(self.procs)}.log").open("w")
        proc = subprocess.Popen(
            self.argv(args),
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        proc.log_path = out.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextmanager
def running_workers(storage: Any, **defaults: Any) -> Iterator[Callable[..., Any]]:
    """``start(queues, **kwargs)`` runs an in-process Worker on ``storage`` (lease 5 s, grace
    1 s unless given) and waits until it serves; every worker started is stopped on exit."""
    from django_jobq.worker import Worker

    workers: list[Worker] = []

    def start(queues: list[str], **kwargs: Any) -> Worker:
        options = {"lease": 5000, "grace": 1, **defaults, **kwargs}
        worker = Worker(queues, storage=storage, **options)
        worker.start()
        assert worker.started.is_set(), "worker did not start"
        workers.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop(hurry=True)
            assert worker.stopped.wait(30)


def health_as_reader() -> dict:
    """``GET /jobq/health`` as a credential that may read every queue sees it (the mirror's
    state is told to those only). Called directly: mirror tests run on one database alias,
    and API keys live in ``default``."""
    from django_jobq.api.operations import health_report
    from django_jobq.api.serializers import HealthSerializer

    return HealthSerializer(health_report(lambda names: names)[0]).data


#: The admin's backends as operators run them: the database backend on SQLite and
#: PostgreSQL, and Redis with the mirror writing rows to either (``admin_backend``).
ADMIN_BACKENDS = [
    ("database", "default"),
    pytest.param(("database", "pg"), marks=pytest.mark.postgres),
    pytest.param(("redis", "default"), marks=pytest.mark.redis),
    pytest.param(("redis", "pg"), marks=[pytest.mark.redis, pytest.mark.postgres]),
]
ADMIN_BACKEND_IDS = ["database-sqlite", "database-postgres", "redis-sqlite", "redis-postgres"]


def admin_backend(request, settings) -> tuple[str, str]:
    """Point JOBQ at the fixture's ``(kind, alias)`` of ``ADMIN_BACKENDS`` (a Redis key prefix
    of the test's own) and return it."""
    kind, alias = request.param
    if kind == "redis":
        settings.JOBQ = {
            **settings.JOBQ, "BACKEND": "redis", "PREFIX": request.getfixturevalue("redis_prefix"),
            "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": alias},
        }  # fmt: skip
    else:
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": alias}
    return kind, alias
