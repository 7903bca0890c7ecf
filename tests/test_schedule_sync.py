"""Schedules declared in JOBQ["SCHEDULES"]: the system check, the sync to rows (create, update,
delete, admin rows left alone, drift written back) on SQLite and PostgreSQL, concurrent syncs
(threads and two runreaper processes), the command and the admin page's notice."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
import threading

import pytest
from django.core.checks.registry import registry as check_registry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from django_jobq.errors import ConfigurationError
from django_jobq.models import Schedule
from django_jobq.queue import Queue
from django_jobq.schedules.core import fire_due
from django_jobq.schedules.sync import digest, is_drifted, sync
from django_jobq.states import JobState
from django_jobq.storage.memory import MemoryStorage
from django_jobq.tasks.registry import registry
from django_jobq.worker import Worker
from django_jobq.worker.reaper import Reaper

from .helpers import PROCESS_START, Spawner, wait_until
from .strategies import built, hostile_ids, hostile_settings, hostile_values, same_json

UTC = dt.UTC
Q = "tests-sched-sync"
ALIASES = [
    "default",
    pytest.param("pg", marks=pytest.mark.postgres),
]
DB = pytest.mark.django_db(databases=["default", "pg"], transaction=True)

NIGHTLY = {"queue": Q, "cron": "0 3 * * *", "timezone": "Europe/Berlin", "payload": {"r": 1}}
ADD = {"task": "tests.proc.add", "interval": 60, "args": [2], "kwargs": {"b": 3}}


@pytest.fixture
def declare(settings):
    def set_schedules(schedules) -> None:
        settings.JOBQ = {**settings.JOBQ, "SCHEDULES": schedules}

    return set_schedules


def rows(alias: str) -> dict[str, Schedule]:
    return {s.name: s for s in Schedule.objects.using(alias).all()}


def schedule_errors() -> list[str]:
    """The registered schedules check's errors. Called alone, not through ``run_checks()``:
    that runs Django's model checks too, whose JSONField check opens a connection on SQLite,
    refused in a test without database access unless an earlier test of the same process had
    already cached the answer (so it failed by test order)."""
    from django_jobq.checks import schedules_settings_check

    assert schedules_settings_check in check_registry.get_checks()
    return [m.msg for m in schedules_settings_check(None) if m.id == "django_jobq.E002"]


@DB
@pytest.mark.parametrize("alias", ALIASES)
class TestSync:
    def test_creates_then_is_idempotent(self, declare, alias):
        declare({"nightly": NIGHTLY, "add": ADD})
        report = sync(using=alias)
        assert sorted(report.created) == ["add", "nightly"]
        got = rows(alias)
        assert {s.source for s in got.values()} == {"settings"}
        assert got["nightly"].next_run_at.astimezone(dt.UTC) > dt.datetime.now(UTC)
        assert got["add"].queue == "tests-tasks"  # the task's queue
        assert got["add"].payload == {"args": [2, 3], "kwargs": {}}
        assert got["add"].job_options == {"max_attempts": 2, "meta": {"task": "tests.proc.add"}}
        before = {n: (s.pk, s.updated_at, s.next_run_at) for n, s in got.items()}
        again = sync(using=alias)
        assert (again.created, again.updated, again.deleted) == ([], [], [])
        assert sorted(again.unchanged) == ["add", "nightly"]
        assert {n: (s.pk, s.updated_at, s.next_run_at) for n, s in rows(alias).items()} == before

    def test_updates_changed_and_deletes_undeclared_only_settings_rows(self, declare, alias):
        hand = Schedule.objects.using(alias).create(name="by-hand", queue=Q, interval=30)
        declare({"nightly": NIGHTLY, "add": ADD})
        sync(using=alias)
        old_next = rows(alias)["nightly"].next_run_at
        declare({"nightly": {**NIGHTLY, "cron": "15 4 * * *", "payload": {"r": 2}}})
        report = sync(using=alias)
        assert report.updated == ["nightly"]
        assert report.deleted == ["tests-tasks/add"]
        got = rows(alias)
        assert set(got) == {"nightly", "by-hand"}
        nightly = got["nightly"]
        assert (nightly.cron, nightly.payload) == ("15 4 * * *", {"r": 2})
        local = nightly.next_run_at.astimezone(dt.timezone(dt.timedelta(hours=1)))
        assert nightly.next_run_at != old_next and local.minute == 15  # re-timed
        assert got["by-hand"].updated_at == hand.updated_at
        declare({})
        assert sync(using=alias).deleted == [f"{Q}/nightly"]
        assert set(rows(alias)) == {"by-hand"}

    def test_an_admin_row_with_the_declared_name_is_a_conflict_left_alone(
        self, declare, alias, caplog
    ):
        hand = Schedule.objects.using(alias).create(name="nightly", queue=Q, interval=30)
        declare({"nightly": NIGHTLY})
        with caplog.at_level(logging.WARNING, "django_jobq.schedules"):
            report = sync(using=alias)
        assert report.conflicts == [f"{Q}/nightly"] and not report.created
        assert "made in the admin" in caplog.text
        got = Schedule.objects.using(alias).get(pk=hand.pk)
        assert (got.interval, got.cron, got.source) == (30, "", "admin")
        declare({})
        assert sync(using=alias).deleted == []  # never deletes an admin row
        assert Schedule.objects.using(alias).filter(pk=hand.pk).exists()

    def test_drift_is_reported_and_settings_win(self, declare, alias, caplog):
        declare({"nightly": NIGHTLY})
        sync(using=alias)
        row = Schedule.objects.using(alias).get(name="nightly")
        assert not is_drifted(row)
        row.cron, row.enabled = "0 5 * * *", False  # an admin edit
        row.save(using=alias)
        assert is_drifted(Schedule.objects.using(alias).get(pk=row.pk))
        with caplog.at_level(logging.WARNING, "django_jobq.schedules"):
            report = sync(using=alias)
        assert report.drifted == ["nightly"] and report.updated == ["nightly"]
        assert "edited since the last sync" in caplog.text
        back = Schedule.objects.using(alias).get(pk=row.pk)
        assert (back.cron, back.enabled, is_drifted(back)) == ("0 3 * * *", True, False)

    def test_concurrent_syncs_make_one_row_each(self, declare, alias):
        """Threads on their own connections sync the same changing declarations at once:
        never a duplicate, never an error, and the rows end as the last declaration says."""
        versions = [
            {f"s{i}": {"queue": Q, "interval": 10 + v, "payload": {"v": v}} for i in range(5)}
            for v in range(4)
        ]
        errors: list[BaseException] = []

        def worker(barrier: threading.Barrier, version: dict) -> None:
            try:
                barrier.wait()
                sync(using=alias)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
            finally:
                connections.close_all()

        for version in versions:
            declare(version)
            barrier = threading.Barrier(3)
            threads = [threading.Thread(target=worker, args=(barrier, version)) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            got = rows(alias)
            assert Schedule.objects.using(alias).count() == len(version)
            assert {n: (s.interval, s.payload) for n, s in got.items()} == {
                n: (spec["interval"], spec["payload"]) for n, spec in version.items()
            }
            assert all(s.settings_digest == digest(s) for s in got.values())


@DB
def test_a_task_schedule_fires_a_call_the_worker_runs(declare):
    """The declared args/kwargs reach the task function through a real worker."""
    declare({"add": ADD})
    sync(using="default")
    storage = MemoryStorage()
    row = Schedule.objects.get(name="add")
    fired = fire_due(now=row.next_run_at, storage=storage, using="default")
    assert len(fired) == 1
    queue = Queue("tests-tasks", storage=storage)
    worker = Worker(["tests-tasks"], storage=storage, handlers=registry, reap_interval=0, grace=1)
    worker.start()
    try:
        done = lambda: queue.get_status(fired[0]).state is JobState.COMPLETED  # noqa: E731
        assert wait_until(done), queue.get_status(fired[0])
        assert queue.get_status(fired[0]).task == "tests.proc.add"
        assert queue.get_result(fired[0]).value["sum"] == 5
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(30)


# -- hostile settings -----------------------------------------------------------------------


HOSTILE = [
    ({"queue": Q, "cron": "0 25 * * *"}, "cron: cron hour field '25': 25 is out of range"),
    ({"queue": Q, "cron": "0 3 * *"}, "expected 5"),
    ({"task": "no.such.task", "interval": 60}, "unknown task 'no.such.task'"),
    ({"task": "tests.proc.add", "interval": 60, "args": [1, 2, 3]}, "tests.proc.add"),
    ({"task": "tests.proc.add", "interval": 60, "payload": {}}, "not 'payload'"),
    ({"queue": Q, "interval": 60, "payload": {"n": float("nan")}}, "payload: "),
    ({"queue": Q, "interval": 60, "options": {"priority": float("inf")}}, "options: "),
    ({"queue": Q, "interval": 60, "payload": "a\x00b"}, "payload: "),
    ({"queue": Q, "interval": 60, "cron": "* * * * *"}, "cron, interval: Give exactly one"),
    ({"queue": Q}, "exactly one of cron and interval"),
    ({"queue": Q, "interval": 0}, "between 1 and"),
    ({"queue": Q, "interval": "60"}, "whole number"),
    ({"queue": Q, "interval": 60, "timezone": "Mars/Olympus"}, "Unknown time zone"),
    ({"queue": Q, "interval": 60, "missed": "always"}, "missed"),
    ({"queue": Q, "interval": 60, "options": {"colour": "red"}}, "colour"),
    ({"queue": Q, "interval": 60, "options": {"run_at": 1}}, "run_at"),
    ({"queue": "a:b", "interval": 60}, "invalid queue name"),
    ({"queue": Q, "interval": 60, "enabled": "yes"}, "'enabled' must be True or False"),
    ({"queue": Q, "interval": 60, "every": 5}, "unknown key(s) ['every']"),
    ({"interval": 60}, "give 'task'"),
    ("0 3 * * *", "must be a dict"),
    ({"queue": Q, "interval": 60, "payload": {1: "a", "b": 2}}, "dict keys must be strings"),
    ({"queue": Q, "interval": 60, "options": {"meta": 5}}, "'meta' must be a dict"),
    ({"queue": Q, "cron": 5}, "'cron' must be a string"),
    ({"task": ["x"], "interval": 60}, "unknown task ['x']"),
    ({"queue": Q, "interval": 60, "payload": None}, "'payload' cannot be None"),
]


@DB
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(("spec", "fragment"), HOSTILE)
def test_hostile_settings_fail_the_check_and_sync_nothing(declare, alias, spec, fragment):
    declare({"nightly": NIGHTLY})
    sync(using=alias)
    before = {n: (s.pk, s.updated_at) for n, s in rows(alias).items()}
    # A valid change beside the bad entry is not applied either: all or nothing.
    declare({"nightly": {**NIGHTLY, "cron": "0 4 * * *"}, "fresh": NIGHTLY, "bad": spec})
    errors = schedule_errors()
    assert len(errors) == 1 and "JOBQ['SCHEDULES']['bad']" in errors[0], errors
    assert fragment in errors[0], errors
    with pytest.raises(ConfigurationError, match=r"not synced"):
        sync(using=alias)
    assert {n: (s.pk, s.updated_at) for n, s in rows(alias).items()} == before
    out = io.StringIO()
    with pytest.raises(CommandError, match=re.escape(fragment)):
        call_command("jobq_schedules", "--sync", "--database", alias, stdout=out)
    assert {n: (s.pk, s.updated_at) for n, s in rows(alias).items()} == before


VALID_NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
# JSON any database stores: half the examples should get as far as the rows.
CLEAN_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"],
                                            exclude_characters="\x00"), max_size=8),
                      children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@pytest.mark.django_db(databases=["default", "pg"])
@pytest.mark.parametrize("alias", ALIASES)
@hostile_settings(80)
@given(
    name=VALID_NAMES | hostile_ids,
    payload=CLEAN_JSON | hostile_values,
    interval=st.integers(1, 10**6) | st.integers(-5, 10**9) | st.none(),
)
def test_any_declaration_is_refused_whole_or_synced_stably(declare, alias, name, payload, interval):
    """Whatever the settings hold: either the check names the entry and the sync writes
    nothing, or the row holds exactly the declaration and a second sync finds nothing to do
    (the digest survives the database's JSON round trip, so no false drift)."""
    Schedule.objects.using(alias).all().delete()
    declare({"nightly": NIGHTLY})
    sync(using=alias)
    before = {n: (s.pk, s.updated_at) for n, s in rows(alias).items()}
    spec = {"queue": Q, "interval": interval, "payload": built(payload)}
    declare({"nightly": NIGHTLY, name: spec})
    errors = schedule_errors()
    if errors:
        with pytest.raises(ConfigurationError):
            sync(using=alias)
        assert {n: (s.pk, s.updated_at) for n, s in rows(alias).items()} == before
        return
    assert sync(using=alias).created == [name]
    row = Schedule.objects.using(alias).get(name=name)
    assert same_json(row.payload, spec["payload"]) and row.interval == interval
    again = sync(using=alias)
    assert (again.created, again.updated, again.drifted) == ([], [], []), again


def test_schedules_not_a_dict_is_a_check_error(declare):
    declare(["nightly"])
    assert schedule_errors() == [
        "JOBQ['SCHEDULES'] must be a dict of name -> schedule, got ['nightly']"
    ]


def test_valid_schedules_pass_the_check(declare):
    declare({"nightly": NIGHTLY, "add": ADD})
    assert schedule_errors() == []


# -- command, reaper, admin -----------------------------------------------------------------


@DB
def test_command_syncs_and_reports(declare):
    declare({"nightly": NIGHTLY})
    out = io.StringIO()
    call_command("jobq_schedules", "--sync", "--database", "default", stdout=out)
    assert out.getvalue() == "synced: created nightly\n"
    out = io.StringIO()
    call_command("jobq_schedules", "--sync", "--database", "default", stdout=out)
    assert out.getvalue() == "synced: 1 unchanged\n"


@DB
def test_the_reaper_syncs_on_start_and_on_its_interval(declare):
    declare({"nightly": NIGHTLY})
    reaper = Reaper([Q], storage=MemoryStorage(), interval=0.01, mirror=False)
    reaper.schedule_sync_interval = 0.05
    thread = threading.Thread(target=reaper.run)
    thread.start()
    try:
        assert wait_until(lambda: Schedule.objects.filter(name="nightly").exists())
        declare({"later": {**NIGHTLY, "cron": "0 5 * * *"}})
        assert wait_until(lambda: set(Schedule.objects.values_list("name", flat=True)) == {"later"})
    finally:
        reaper.stop()
        thread.join()


@DB
def test_a_reaper_with_bad_settings_keeps_the_rows_and_sweeps(declare, caplog):
    declare({"nightly": NIGHTLY})
    sync(using="default")
    declare({"nightly": {**NIGHTLY, "cron": "nonsense"}})
    reaper = Reaper([Q], storage=MemoryStorage(), interval=0.01, mirror=False)
    with caplog.at_level(logging.WARNING, "django_jobq.reaper"):
        assert reaper.sync_schedules() is None
    assert "schedules not synced" in caplog.text
    assert Schedule.objects.get(name="nightly").cron == "0 3 * * *"
    reaper.run_once()  # and the sweep still runs


@pytest.mark.django_db(databases=["default"])
def test_admin_page_says_settings_and_drift(declare, admin_client):
    declare({"nightly": NIGHTLY})
    sync(using="default")
    row = Schedule.objects.get(name="nightly")
    url = reverse("admin:django_jobq_schedule_change", args=[row.pk])
    page = admin_client.get(url).content.decode()
    assert "declared in JOBQ[&#x27;SCHEDULES&#x27;]" in page and "Drift" not in page
    row.interval, row.cron = 90, ""
    row.save()
    page = admin_client.get(url).content.decode()
    assert "Drift: this schedule was edited here" in page
    hand = Schedule.objects.create(name="by-hand", queue=Q, interval=30)
    page = admin_client.get(
        reverse("admin:django_jobq_schedule_change", args=[hand.pk])
    ).content.decode()
    assert "SCHEDULES" not in page


# -- two reaper processes -------------------------------------------------------------------


def log_of(proc) -> str:
    with open(proc.log_path) as fh:
        return fh.read()


@pytest.mark.slow
@DB
@pytest.mark.parametrize("alias", ALIASES)
def test_two_reaper_processes_sync_at_once(alias, tmp_path):
    """Two runreaper processes start on the same declarations: one row per schedule, made by
    one of them, and the schedule fires."""
    declared = {f"p{i}": {"queue": Q, "interval": 1, "payload": {"i": i}} for i in range(5)}
    spawner = Spawner(
        tmp_path,
        {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": alias,
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": str(connections["pg"].settings_dict["NAME"]),
            "JOBQ_TEST_SCHEDULES": json.dumps(declared),
        },
    )
    try:
        reapers = [spawner("runreaper", "--interval", "0.05", log=f"r{i}") for i in range(2)]
        fired = lambda: Schedule.objects.using(alias).filter(last_run_at__isnull=False).count()  # noqa: E731
        assert wait_until(lambda: fired() == 5, PROCESS_START), [log_of(p) for p in reapers]
        # Both up (signal handlers in place) before the stop: on a slow machine one reaper may
        # still be starting when the other has fired every schedule.
        up = lambda: all("reaper sweeping every" in log_of(p) for p in reapers)  # noqa: E731
        assert wait_until(up, PROCESS_START), [log_of(p) for p in reapers]
        spawner.stop_all()
        assert [p.returncode for p in reapers] == [0, 0]
    finally:
        spawner.stop_all()
    got = list(Schedule.objects.using(alias).values_list("name", "source", "payload"))
    assert sorted(got) == [(f"p{i}", "settings", {"i": i}) for i in range(5)]
    logs = "".join(log_of(p) for p in reapers)
    assert "Traceback" not in logs and "not synced" not in logs, logs


@pytest.mark.django_db(databases=["default", "pg"])
@pytest.mark.parametrize("alias", ALIASES)
def test_an_integral_float_stays_a_float_and_shows_no_drift(declare, alias):
    """PostgreSQL's jsonb reads 1e16 back as an int unless it is written with a fraction."""
    payload = {"big": 1e16, "huge": [1.5e300, -2e22], "small": 1e-7, "text": "1e+16"}
    declare({"floats": {"queue": Q, "interval": 60, "payload": payload}})
    assert sync(using=alias).created == ["floats"]
    assert same_json(Schedule.objects.using(alias).get(name="floats").payload, payload)
    again = sync(using=alias)
    assert (again.created, again.updated, again.drifted) == ([], [], []), again
