"""Broadcast subscribers as real ``runworker`` processes: a worker SIGKILLed mid-message.

Its messages are redelivered to its own group only (other groups handle each message once),
and no message is lost, on Redis, SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from django.db import connections

from django_jobq.broadcast import Broadcast

from .helpers import Spawner, wait_until

pytestmark = pytest.mark.slow
NAME = "tests-bcast"  # tests/jobsapp/jobs.py: groups alpha and beta append to a ledger
ALIASES = {"sqlite": "default", "postgres": "pg"}


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def backend(request):
    if request.param in ("redis", "postgres"):
        request.applymarker(getattr(pytest.mark, request.param))
    return request.param


@pytest.fixture
def spawn(backend, request, tmp_path):
    if backend == "redis":
        env = {"JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix")}
    else:
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": ALIASES[backend],
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        }
    env["JOBQ_TEST_SQLITE"] = str(connections["default"].settings_dict["NAME"])
    spawner = Spawner(tmp_path, env)
    yield spawner
    spawner.stop_all()


def ledger(path: Path) -> list[tuple[str, str, str, str]]:
    """(kind, group, message id, pid) per line."""
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines() if line.count(" ") == 3]


def test_a_sigkilled_subscriber_is_redelivered_to_its_group_only(live_storage, spawn, tmp_path):
    bc = Broadcast(NAME, storage=live_storage)
    bc.subscribe("alpha", start="earliest")
    bc.subscribe("beta", start="earliest")
    path = tmp_path / "ledger.txt"
    ids = [f"b{i}" for i in range(24)]
    bc.publish_many([(i, {"seconds": 0.2, "ledger": str(path)}) for i in ids])
    worker = ("runworker", "-c", "4", "--lease", "1500", "--subscriber")
    victim = spawn(*worker, f"{NAME}:alpha", log="victim")
    spawn(*worker, f"{NAME}:beta", log="beta")

    def alpha_mid_message() -> bool:
        lines = ledger(path)
        started = {i for k, g, i, _ in lines if (k, g) == ("start", "alpha")}
        done = {i for k, g, i, _ in lines if (k, g) == ("done", "alpha")}
        return len(done) >= 4 and len(started - done) > 0

    assert wait_until(alpha_mid_message, 60), f"alpha never ran: {ledger(path)}"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    at_kill = ledger(path)
    interrupted = {i for k, g, i, _ in at_kill if (k, g) == ("start", "alpha")} - {
        i for k, g, i, _ in at_kill if (k, g) == ("done", "alpha")
    }
    assert interrupted  # it died holding messages
    spawn(*worker, f"{NAME}:alpha", log="replacement")

    def settled() -> bool:
        return all(s.lag == 0 and s.pending == 0 for s in bc.status())

    assert wait_until(settled, 90), bc.status()
    lines = ledger(path)
    for group in ("alpha", "beta"):
        done = Counter(i for k, g, i, _ in lines if (k, g) == ("done", group))
        assert set(done) == set(ids), f"{group} lost {set(ids) - set(done)}"  # 0 lost
    beta_starts = Counter(i for k, g, i, _ in lines if (k, g) == ("start", "beta"))
    assert beta_starts == Counter(ids)  # the other group: every message once, none again
    alpha_starts = Counter(i for k, g, i, _ in lines if (k, g) == ("start", "alpha"))
    again = {i for i, n in alpha_starts.items() if n > 1}
    # Redelivered: what the victim held when it died (started, and its verdict not yet
    # stored: a handler that had finished may not have had its verdict committed), at most
    # its 4 slots' worth.
    victim_started = {
        i for k, g, i, p in at_kill if (k, g, p) == ("start", "alpha", str(victim.pid))
    }
    assert interrupted <= again <= victim_started
    assert len(again) <= 4
    victim_pid = str(victim.pid)
    assert all(p != victim_pid for k, g, i, p in lines if k == "done" and i in interrupted)
    assert {(s.group, s.dead, s.missed) for s in bc.status()} == {("alpha", 0, 0), ("beta", 0, 0)}
