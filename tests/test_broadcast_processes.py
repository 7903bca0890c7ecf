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


def test_a_subscriber_timeout_stops_a_handler_in_a_runworker_process(live_storage, spawn,
                                                                     tmp_path):  # fmt: skip
    """tests/jobsapp/jobs.py ``bcast_timeout`` (group gamma, timeout 0.5 s): its first attempt
    runs until the timeout asks it to stop, then fails; the second attempt completes."""
    bc = Broadcast("tests-bcast-timeout", storage=live_storage)
    bc.subscribe("gamma", start="earliest")
    path = tmp_path / "ledger.txt"
    bc.publish({"ledger": str(path)}, id="t1")
    spawn("runworker", "-c", "2", "--subscriber", "tests-bcast-timeout:gamma", log="gamma")
    assert wait_until(lambda: bc.delivery("gamma", "t1").state == "done", 60), bc.status()
    lines = [line.split() for line in path.read_text().splitlines()]
    # kind, group, id, attempt, pid, cancelled-flag
    assert [(k, a, c) for k, _, _, a, _, c in lines] == [("stopped", "1", "1"), ("done", "2", "0")]


def test_the_process_pool_kills_a_subscriber_at_its_hard_timeout(live_storage, spawn, tmp_path):
    """tests/jobsapp/jobs.py ``bcast_hard`` on ``runworker --pool process``: in group *hung*
    (hard timeout 1 s, 2 attempts) message "h1" never returns on its first attempt: its child
    is killed and the second attempt, in a new child, completes; "h2" never returns at all
    and becomes a dead letter (HardTimeout). Group *calm*, on the same worker, handles each
    message once."""
    import json

    bc = Broadcast("tests-bcast-hard", storage=live_storage)
    bc.subscribe("hung", start="earliest")
    bc.subscribe("calm", start="earliest")
    path = tmp_path / "ledger.txt"
    bc.publish({"ledger": str(path)}, id="h1")
    bc.publish({"ledger": str(path), "always": True}, id="h2")
    worker = spawn("runworker", "--pool", "process", "-c", "2", "--lease", "3000",
                   "--subscriber", "tests-bcast-hard", log="hard")  # fmt: skip

    def settled() -> bool:
        return all(s.lag == 0 and s.pending == 0 for s in bc.status())

    assert wait_until(settled, 120), bc.status()
    assert bc.delivery("hung", "h1").state == "done"
    assert bc.delivery("hung", "h2").state == "dead"
    [dead] = bc.dead_letters("hung")
    assert dead.message_id == "h2" and dead.attempts == 2
    assert json.loads(dead.error)["type"].endswith(".HardTimeout")
    lines = [tuple(line.split()) for line in path.read_text().splitlines()]
    hung = [(k, i, a, p) for k, g, i, a, p in lines if g == "hung"]
    starts = {(i, a): p for k, i, a, p in hung if k == "start"}
    assert set(starts) == {("h1", "1"), ("h1", "2"), ("h2", "1"), ("h2", "2")}
    assert [(k, i, a) for k, i, a, _ in hung if k == "done"] == [("done", "h1", "2")]
    # Each attempt ran in a child of the worker, never in the worker itself, and an attempt
    # after a kill ran in a new child (the killed one is gone).
    assert str(worker.pid) not in starts.values()
    assert starts[("h1", "1")] not in (
        starts[("h1", "2")],
        starts[("h2", "1")],
        starts[("h2", "2")],
    )
    calm = Counter((k, i) for k, g, i, _, _ in lines if g == "calm")
    assert calm == Counter({("start", "h1"): 1, ("done", "h1"): 1, ("start", "h2"): 1,
                            ("done", "h2"): 1})  # fmt: skip
    assert {(s.group, s.dead, s.missed) for s in bc.status()} == {("hung", 1, 0), ("calm", 0, 0)}
