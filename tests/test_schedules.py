"""Periodic schedules: the cron parser, ticks across DST, fire_due's exactly-once and missed-tick
rules on every backend (threads and separate reaper processes), the reaper hook, the admin and
the jobq_schedules command."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
import threading
import zoneinfo
from collections import Counter
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.urls import reverse

from django_jobq import InvalidPayload
from django_jobq.models import Schedule
from django_jobq.queue import Queue
from django_jobq.schedules import core as schedules
from django_jobq.schedules import validate_schedule
from django_jobq.schedules.core import (
    fire_due,
    fire_now,
    manual_job_id,
    schedules_alias,
    tick_job_id,
)
from django_jobq.schedules.cron import parse_cron
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.validation import JOB_ID_MAX_LENGTH, validate_job_id
from django_jobq.worker.reaper import Reaper

from .helpers import PROCESS_START, Spawner, wait_until

UTC = dt.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")
Q = "tests-sched"
T0 = dt.datetime(2030, 1, 7, 12, 0, tzinfo=UTC)  # a Monday, noon
SECOND = dt.timedelta(seconds=1)
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
# Schedules of the memory and Redis backends live on the mirror's alias ("default"); the
# database backends' on their own alias, which conftest marks for them.
ON_DEFAULT_DB = pytest.mark.django_db(databases=["default"], transaction=True)


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(expr: str, start: dt.datetime, count: int, tz: dt.tzinfo = UTC) -> list[dt.datetime]:
    """The next ``count`` ticks after ``start``, in UTC."""
    cron, out, at = parse_cron(expr), [], start
    for _ in range(count):
        at = cron.next_after(at, tz)
        out.append(at.astimezone(UTC))
    return out


# -- the parser -----------------------------------------------------------------------------


class TestCronFields:
    @pytest.mark.parametrize(
        ("expr", "attr", "expected"),
        [
            ("*/25 * * * *", "minutes", (0, 25, 50)),
            ("1-10/2 * * * *", "minutes", (1, 3, 5, 7, 9)),
            ("5,1,5,3 * * * *", "minutes", (1, 3, 5)),
            ("0 */6 * * *", "hours", (0, 6, 12, 18)),
            ("0 9-17/4,23 * * *", "hours", (9, 13, 17, 23)),
            ("0 0 1 jan-mar,DEC *", "months", (1, 2, 3, 12)),
            ("0 0 * * MON-fri", "weekdays", (1, 2, 3, 4, 5)),
            ("0 0 * * 7", "weekdays", (0,)),
            ("0 0 * * 0,7", "weekdays", (0,)),
            ("0 0 * * 5-7", "weekdays", (0, 5, 6)),
            ("0 0 * * sat-sun", "weekdays", (0, 6)),
            ("0 0 * * mon-sun", "weekdays", (0, 1, 2, 3, 4, 5, 6)),
            ("0 0 * * */2", "weekdays", (0, 2, 4, 6)),
        ],
    )
    def test_values(self, expr, attr, expected):
        assert getattr(parse_cron(expr), attr) == expected

    @pytest.mark.parametrize(
        ("macro", "same_as"),
        [
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("@monthly", "0 0 1 * *"),
            ("@weekly", "0 0 * * 0"),
            ("@daily", "0 0 * * *"),
            ("@MIDNIGHT", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
        ],
    )
    def test_macros(self, macro, same_as):
        start = utc(2026, 5, 17, 10, 11)
        assert ticks(macro, start, 3) == ticks(same_as, start, 3)

    @pytest.mark.parametrize(
        ("expr", "fragments"),
        [
            ("* * * *", ["4 field(s)", "expected 5"]),
            ("* * * * * *", ["6 field(s)"]),
            ("", ["0 field(s)"]),
            ("60 * * * *", ["minute", "60 is out of range 0-59"]),
            ("* 24 * * *", ["hour", "24 is out of range 0-23"]),
            ("* * 0 * *", ["day-of-month", "0 is out of range 1-31"]),
            ("* * * 13 *", ["month", "13 is out of range 1-12"]),
            ("* * * * 8", ["day-of-week", "8 is out of range 0-7"]),
            ("* * * foo *", ["month", "'foo' is not a number", "jan"]),
            ("* * * * monday", ["day-of-week", "'monday'"]),
            ("5/10 * * * *", ["minute", "a step needs a range or *", "5-59/10"]),
            ("*/0 * * * *", ["minute", "step '0'"]),
            ("*/x * * * *", ["minute", "step 'x'"]),
            ("10-5 * * * *", ["minute", "'10-5' goes backwards"]),
            ("1,,2 * * * *", ["minute", "empty list item"]),
            ("-1 * * * *", ["minute", "''"]),
            ("² * * * *", ["minute", "'²' is not a number"]),
            ("0 0 31 4,6 *", ["never fires", "'31'", "'4,6'"]),
            ("0 0 30 feb *", ["never fires"]),
            ("@reboot", ["unknown cron macro", "@daily"]),
        ],
    )
    def test_errors_name_the_field_and_value(self, expr, fragments):
        with pytest.raises(ValueError) as exc:
            parse_cron(expr)
        for fragment in fragments:
            assert fragment in str(exc.value)

    def test_feb_30_is_fine_when_the_weekday_can_match_instead(self):
        # Both day fields restricted: either matches, so Mondays of February still fire.
        assert ticks("0 0 30 2 mon", utc(2026, 1, 1), 2) == [utc(2026, 2, 2), utc(2026, 2, 9)]

    def test_after_must_be_aware(self):
        with pytest.raises(ValueError, match="timezone-aware"):
            parse_cron("* * * * *").next_after(dt.datetime(2026, 1, 1), UTC)  # noqa: DTZ001


class TestCronTicksUTC:
    def test_every_minute_is_strictly_after(self):
        assert ticks("* * * * *", utc(2026, 1, 1, 0, 0, 0), 2) == [
            utc(2026, 1, 1, 0, 1),
            utc(2026, 1, 1, 0, 2),
        ]
        assert ticks("* * * * *", utc(2026, 1, 1, 0, 0, 30), 1) == [utc(2026, 1, 1, 0, 1)]

    def test_steps_roll_over_hours_days_and_years(self):
        assert ticks("*/20 23 31 12 *", utc(2026, 12, 31, 23, 30), 3) == [
            utc(2026, 12, 31, 23, 40),
            utc(2027, 12, 31, 23, 0),
            utc(2027, 12, 31, 23, 20),
        ]

    def test_leap_day(self):
        assert ticks("0 0 29 2 *", utc(2027, 6, 1), 2) == [utc(2028, 2, 29), utc(2032, 2, 29)]
        # 2100 is not a leap year.
        assert ticks("0 0 29 2 *", utc(2096, 3, 1), 1) == [utc(2104, 2, 29)]

    def test_leap_day_on_a_sunday_is_decades_apart(self):
        # "*/7" starts with "*": the weekday field is unrestricted in the Vixie sense, so the
        # day-of-month AND the weekday must match: 29 February falling on a Sunday.
        assert ticks("0 0 29 2 */7", utc(2026, 1, 1), 2) == [utc(2032, 2, 29), utc(2060, 2, 29)]

    def test_both_day_fields_restricted_either_matches(self):
        # The 13th, and every Friday.
        assert ticks("0 0 13 * fri", utc(2026, 1, 1), 5) == [
            utc(2026, 1, 2),
            utc(2026, 1, 9),
            utc(2026, 1, 13),
            utc(2026, 1, 16),
            utc(2026, 1, 23),
        ]

    def test_a_day_field_starting_with_star_needs_both(self):
        # Odd days that are Fridays (Vixie: "*/2" counts as unrestricted).
        assert ticks("0 0 */2 * fri", utc(2026, 1, 1), 4) == [
            utc(2026, 1, 9),
            utc(2026, 1, 23),
            utc(2026, 2, 13),
            utc(2026, 2, 27),
        ]
        # First Sunday of the month, against days 1-7 plus every Sunday.
        assert ticks("0 0 1-7 * */7", utc(2026, 1, 1), 2) == [utc(2026, 1, 4), utc(2026, 2, 1)]
        assert ticks("0 0 1-7 * sun", utc(2026, 1, 6), 3) == [
            utc(2026, 1, 7),
            utc(2026, 1, 11),
            utc(2026, 1, 18),
        ]

    def test_only_weekday_restricted(self):
        assert ticks("30 8 * * mon-fri", utc(2026, 1, 9, 9), 2) == [  # a Friday, after 08:30
            utc(2026, 1, 12, 8, 30),
            utc(2026, 1, 13, 8, 30),
        ]


class TestCronDST:
    def test_berlin_gap_fires_at_the_end_of_the_gap_once(self):
        # 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist.
        assert ticks("30 2 * * *", utc(2026, 3, 28, 12), 3, BERLIN) == [
            utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first instant after the gap
            utc(2026, 3, 30, 0, 30),  # 02:30 CEST
            utc(2026, 3, 31, 0, 30),
        ]

    def test_berlin_gap_with_many_ticks_inside_fires_once(self):
        start = dt.datetime(2026, 3, 29, 1, 50, tzinfo=BERLIN)
        assert ticks("*/15 * * * *", start, 3, BERLIN) == [
            utc(2026, 3, 29, 1, 0),  # 02:00, 02:15, 02:30, 02:45 and 03:00 are one instant
            utc(2026, 3, 29, 1, 15),
            utc(2026, 3, 29, 1, 30),
        ]

    def test_berlin_overlap_fires_the_first_occurrence_only(self):
        # 2026-10-25: 03:00 CEST goes back to 02:00 CET (01:00 UTC); 02:00-02:59 happen twice.
        assert ticks("30 2 * * *", utc(2026, 10, 24, 12), 2, BERLIN) == [
            utc(2026, 10, 25, 0, 30),  # 02:30 CEST, not 02:30 CET
            utc(2026, 10, 26, 1, 30),  # 02:30 CET
        ]
        start = dt.datetime(2026, 10, 25, 1, 45, tzinfo=BERLIN)
        assert ticks("*/30 * * * *", start, 3, BERLIN) == [
            utc(2026, 10, 25, 0, 0),  # 02:00 CEST
            utc(2026, 10, 25, 0, 30),  # 02:30 CEST
            utc(2026, 10, 25, 2, 0),  # 03:00 CET: the repeated 02:00 and 02:30 CET are skipped
        ]

    def test_after_inside_the_second_pass_does_not_fire_the_repeat(self):
        second_pass = dt.datetime(2026, 10, 25, 2, 10, fold=1, tzinfo=BERLIN)
        assert second_pass.astimezone(UTC) == utc(2026, 10, 25, 1, 10)
        assert ticks("30 2 * * *", second_pass, 1, BERLIN) == [utc(2026, 10, 26, 1, 30)]
        assert ticks("*/30 * * * *", second_pass, 1, BERLIN) == [utc(2026, 10, 25, 2, 0)]

    def test_new_york_gap_and_overlap(self):
        # 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC).
        assert ticks("30 2 * * *", utc(2026, 3, 7, 12), 2, NEW_YORK) == [
            utc(2026, 3, 8, 7, 0),
            utc(2026, 3, 9, 6, 30),
        ]
        # 2026-11-01: 02:00 EDT -> 01:00 EST (06:00 UTC); 01:30 happens twice.
        assert ticks("30 1 * * *", utc(2026, 10, 31, 12), 2, NEW_YORK) == [
            utc(2026, 11, 1, 5, 30),  # 01:30 EDT
            utc(2026, 11, 2, 6, 30),  # 01:30 EST, next day
        ]
        hourly = ticks("0 * * * *", dt.datetime(2026, 11, 1, 0, 30, tzinfo=NEW_YORK), 3, NEW_YORK)
        assert hourly == [utc(2026, 11, 1, 5), utc(2026, 11, 1, 7), utc(2026, 11, 1, 8)]

    def test_half_hour_shift_and_a_skipped_day(self):
        # Lord Howe moves 30 minutes (02:00 -> 02:30 on 2026-10-04).
        lord_howe = zoneinfo.ZoneInfo("Australia/Lord_Howe")
        assert ticks("15 2 * * *", utc(2026, 10, 3, 0), 1, lord_howe) == [
            utc(2026, 10, 3, 15, 30)  # 02:30 +11:00
        ]
        # Samoa skipped 30 December 2011 entirely: its noon fires at the first instant of the
        # 31st, once, then the 31st's own noon follows.
        apia = zoneinfo.ZoneInfo("Pacific/Apia")
        assert ticks("0 12 * * *", dt.datetime(2011, 12, 29, 13, tzinfo=apia), 2, apia) == [
            utc(2011, 12, 30, 10, 0),  # 2011-12-31 00:00 +14:00
            utc(2011, 12, 30, 22, 0),  # 2011-12-31 12:00 +14:00
        ]


# -- validation -----------------------------------------------------------------------------


def schedule_of(**fields) -> Schedule:
    base = {"name": "nightly", "queue": Q, "cron": "0 3 * * *", "timezone": "Europe/Berlin"}
    return Schedule(**{**base, **fields})


class TestValidation:
    def test_a_valid_schedule_passes(self):
        cron = schedule_of(job_options={"priority": 5, "max_attempts": 2})
        interval = schedule_of(cron="", interval=30, payload={"a": [1, 2]})
        for schedule in (cron, interval):
            validate_schedule(schedule)  # raises ValidationError on any fault
        # The same schedules with one fault each are refused: the validator checks these
        # very objects (one that accepted everything would pass the calls above).
        cron.job_options["priority"] = 5000
        interval.interval = 0
        for schedule, field in ((cron, "job_options"), (interval, "interval")):
            with pytest.raises(ValidationError) as exc:
                validate_schedule(schedule)
            assert list(exc.value.message_dict) == [field]

    @pytest.mark.parametrize(
        ("fields", "field", "fragment"),
        [
            ({"name": "has space"}, "name", "A-Z a-z 0-9"),
            ({"name": ".hidden"}, "name", "not starting with"),
            ({"name": "x" * 97}, "name", "1-96 characters"),
            ({"queue": "bad queue"}, "queue", "invalid queue name"),
            ({"cron": "", "interval": None}, "cron", "exactly one of cron and interval"),
            ({"interval": 60}, "interval", "exactly one of cron and interval"),
            ({"cron": "61 * * * *"}, "cron", "61 is out of range 0-59"),
            ({"cron": "", "interval": 0}, "interval", "between 1 and"),
            ({"timezone": "Mars/Olympus"}, "timezone", "Unknown time zone 'Mars/Olympus'"),
            ({"timezone": "../etc/passwd"}, "timezone", "Unknown time zone"),
            ({"missed": "sometimes"}, "missed", "skip, run_once"),
            ({"job_options": {"prio": 1}}, "job_options", "['prio']"),
            ({"job_options": {"singleton": True}}, "job_options", "['singleton']"),
            ({"job_options": {"priority": 5000}}, "job_options", "priority must be between"),
            ({"job_options": {"max_attempts": "3"}}, "job_options", "max_attempts"),
            ({"job_options": {"dedup_mode": "throttle"}}, "job_options", "dedup_key"),
            ({"job_options": [1]}, "job_options", "JSON object"),
        ],
    )
    def test_errors_land_on_their_field(self, fields, field, fragment):
        with pytest.raises(ValidationError) as exc:
            validate_schedule(schedule_of(**fields))
        assert field in exc.value.message_dict, exc.value.message_dict
        assert any(fragment in m for m in exc.value.message_dict[field]), exc.value.message_dict

    def test_longest_name_makes_valid_ids(self):
        name = "x" * 96
        validate_schedule(schedule_of(name=name))
        # The longest ids it can make: a tick and a "run now" in the last second of year 9999.
        last = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
        for job_id in (tick_job_id(name, last), manual_job_id(name, last)):
            assert validate_job_id(job_id) == job_id
        assert len(manual_job_id(name, last)) == JOB_ID_MAX_LENGTH  # not one character to spare

    def test_oversized_payload_is_a_payload_error(self, settings):
        settings.JOBQ = {**settings.JOBQ, "MAX_PAYLOAD_BYTES": 100}
        with pytest.raises(ValidationError) as exc:
            validate_schedule(schedule_of(payload={"blob": "x" * 200}))
        assert list(exc.value.message_dict) == ["payload"]


@pytest.mark.django_db(databases=["default", "pg"])
@pytest.mark.parametrize("alias", ["default", "pg"])
@pytest.mark.parametrize(
    "field, value",
    [
        ("payload", {"n": float("nan")}),
        ("payload", [float("inf")]),
        ("payload", {"text": "a\x00b"}),
        ("job_options", {"priority": float("-inf")}),
    ],
)
def test_saving_a_schedule_from_python_refuses_unstorable_json_clearly(alias, field, value):
    """The database would refuse these with an error naming neither field nor cause (SQLite's
    JSON_VALID check, PostgreSQL's jsonb); the model says which and stores nothing."""
    with pytest.raises(InvalidPayload, match=f"schedule {field}"):
        Schedule.objects.using(alias).create(name="poison", queue=Q, interval=60, **{field: value})
    with pytest.raises(InvalidPayload):
        Schedule.objects.using(alias).update_or_create(
            name="poison", queue=Q, defaults={"interval": 60, field: value}
        )
    assert not Schedule.objects.using(alias).filter(name="poison").exists()


# -- next_run_at bookkeeping ------------------------------------------------------------------


@pytest.mark.django_db(databases=["default"])
class TestRetime:
    def test_new_cron_schedule_gets_its_next_tick(self):
        s = Schedule.objects.create(name="c", queue=Q, cron="0 3 * * *", timezone="Europe/Berlin")
        assert s.next_run_at == parse_cron("0 3 * * *").next_after(s.created_at, BERLIN)
        assert s.next_run_at.astimezone(BERLIN).hour == 3

    def test_new_interval_schedule_starts_one_interval_from_now(self):
        before = dt.datetime.now(UTC)
        s = Schedule.objects.create(name="i", queue=Q, interval=90)
        assert before + 90 * SECOND <= s.next_run_at <= before + 92 * SECOND
        assert s.next_run_at.microsecond == 0  # ticks are whole seconds: stable job ids

    def test_an_explicit_next_run_at_is_kept_on_create(self):
        s = Schedule.objects.create(name="e", queue=Q, interval=5, next_run_at=T0)
        assert Schedule.objects.get(pk=s.pk).next_run_at == T0

    def test_timing_edits_recompute_other_edits_do_not(self):
        s = Schedule.objects.create(name="e", queue=Q, cron="0 3 * * *", next_run_at=T0)
        s.payload = {"changed": True}
        s.save()
        assert Schedule.objects.get(pk=s.pk).next_run_at == T0
        s.cron = "*/5 * * * *"
        s.save()
        fresh = Schedule.objects.get(pk=s.pk).next_run_at
        now = dt.datetime.now(UTC)
        assert now < fresh <= now + 5 * MINUTE and fresh.minute % 5 == 0
        s = Schedule.objects.get(pk=s.pk)
        s.timezone = "America/New_York"
        s.cron = "0 3 * * *"
        s.save()
        assert s.next_run_at.astimezone(NEW_YORK).hour == 3

    def test_enabling_again_recomputes(self):
        s = Schedule.objects.create(
            name="e", queue=Q, cron="0 3 * * *", next_run_at=T0, enabled=False
        )
        s.enabled = True
        s.save()
        assert Schedule.objects.get(pk=s.pk).next_run_at > dt.datetime.now(UTC)

    def test_update_fields_without_next_run_at_is_left_alone(self):
        s = Schedule.objects.create(name="e", queue=Q, cron="0 3 * * *", next_run_at=T0)
        s.cron = "0 4 * * *"
        s.save(update_fields=["cron"])
        assert Schedule.objects.get(pk=s.pk).next_run_at == T0


# -- fire_due on every backend ----------------------------------------------------------------


@pytest.fixture
def alias(storage) -> str:
    return schedules_alias(storage)


def make(alias: str, name: str = "s", **fields) -> Schedule:
    fields.setdefault("queue", Q)
    return Schedule.objects.using(alias).create(name=name, **fields)


def row(alias: str, name: str = "s") -> Schedule:
    return Schedule.objects.using(alias).get(name=name)


def stored_ids(storage, ids) -> set[str]:
    return {i for i in ids if storage.get_record(Q, i) is not None}


def job_count(storage) -> int:
    return sum(storage.counts(Q).values())


@ON_DEFAULT_DB
class TestFireDue:
    def test_a_due_tick_fires_once_and_advances(self, storage, alias):
        make(alias, cron="*/5 * * * *", next_run_at=T0, payload={"n": 1})
        job_id = tick_job_id("s", T0)
        assert job_id == f"schedule.s.{int(T0.timestamp())}"
        assert fire_due(now=T0 + 10 * SECOND, storage=storage, using=alias) == [job_id]
        assert fire_due(now=T0 + 20 * SECOND, storage=storage, using=alias) == []
        s = row(alias)
        assert s.next_run_at == T0 + 5 * MINUTE
        assert (s.last_run_at, s.last_job_id) == (T0 + 10 * SECOND, job_id)
        record = storage.get_record(Q, job_id)
        assert json.loads(record.payload) == {"n": 1}
        assert job_count(storage) == 1

    def test_job_options_are_applied(self, storage, alias):
        make(alias, interval=60, next_run_at=T0, job_options={"priority": 7, "max_attempts": 9})
        [job_id] = fire_due(now=T0, storage=storage, using=alias)
        record = storage.get_record(Q, job_id)
        assert (record.priority, record.max_attempts) == (7, 9)

    def test_not_due_and_disabled_are_left_alone(self, storage, alias):
        make(alias, "later", interval=60, next_run_at=T0 + SECOND)
        make(alias, "off", interval=60, next_run_at=T0 - SECOND, enabled=False)
        assert fire_due(now=T0, storage=storage, using=alias) == []
        assert row(alias, "later").next_run_at == T0 + SECOND
        assert row(alias, "off").next_run_at == T0 - SECOND
        assert job_count(storage) == 0

    def test_a_schedule_without_next_run_gets_one(self, storage, alias):
        make(alias, cron="0 * * * *", next_run_at=T0)
        Schedule.objects.using(alias).update(next_run_at=None)  # as a raw edit would leave it
        assert fire_due(now=T0 + 30 * MINUTE, storage=storage, using=alias) == []
        assert row(alias).next_run_at == T0 + HOUR

    def test_ticks_within_the_grace_catch_up_one_by_one(self, storage, alias):
        make(alias, interval=10, next_run_at=T0)
        fired = fire_due(now=T0 + 35 * SECOND, storage=storage, using=alias)
        assert fired == [tick_job_id("s", T0 + k * 10 * SECOND) for k in range(4)]
        assert row(alias).next_run_at == T0 + 40 * SECOND

    def test_skip_drops_missed_ticks(self, storage, alias):
        make(alias, cron="0 * * * *", next_run_at=T0 - 5 * HOUR, missed="skip")
        assert fire_due(now=T0 + 30 * MINUTE, storage=storage, using=alias) == []
        assert row(alias).next_run_at == T0 + HOUR
        assert job_count(storage) == 0

    def test_skip_still_fires_a_tick_within_the_grace(self, storage, alias):
        make(alias, cron="0 * * * *", next_run_at=T0 - 5 * HOUR, missed="skip")
        fired = fire_due(now=T0 + 20 * SECOND, storage=storage, using=alias)
        assert fired == [tick_job_id("s", T0)]
        assert row(alias).next_run_at == T0 + HOUR

    def test_the_grace_is_configurable(self, storage, alias):
        make(alias, cron="0 * * * *", next_run_at=T0, missed="skip")
        late = T0 + 5 * MINUTE
        assert fire_due(now=late, storage=storage, using=alias, grace=MINUTE) == []
        make(alias, "s2", cron="0 * * * *", next_run_at=T0, missed="skip")
        fired = fire_due(now=late, storage=storage, using=alias, grace=10 * MINUTE)
        assert fired == [tick_job_id("s2", T0)]

    def test_run_once_fires_the_latest_missed_tick(self, storage, alias):
        make(alias, cron="0 * * * *", next_run_at=T0 - 5 * HOUR, missed="run_once")
        fired = fire_due(now=T0 + 30 * MINUTE, storage=storage, using=alias)
        assert fired == [tick_job_id("s", T0)]
        assert row(alias).next_run_at == T0 + HOUR
        assert job_count(storage) == 1

    def test_run_once_after_months_and_with_intervals(self, storage, alias):
        make(alias, "daily", cron="0 3 * * *", next_run_at=T0 - 100 * 24 * HOUR,
             missed="run_once", timezone="Europe/Berlin")  # fmt: skip
        make(alias, "every7s", interval=7, next_run_at=T0 - HOUR, missed="run_once")
        fired = fire_due(now=T0, storage=storage, using=alias)
        # 03:00 in Berlin (winter) is 02:00 UTC; 3600 s = 514 * 7 s + 2 s.
        assert sorted(fired) == sorted(
            [tick_job_id("daily", T0 - 10 * HOUR), tick_job_id("every7s", T0 - 2 * SECOND)]
        )
        assert row(alias, "daily").next_run_at == T0 + 14 * HOUR
        assert row(alias, "every7s").next_run_at == T0 + 5 * SECOND

    def test_a_stale_reaper_neither_stores_nor_moves_the_schedule(self, storage, alias):
        make(alias, interval=60, next_run_at=T0)
        stale = row(alias)  # read by a slow reaper before the fast one fires twice
        assert fire_due(now=T0, storage=storage, using=alias) == [tick_job_id("s", T0)]
        fire_due(now=T0 + MINUTE, storage=storage, using=alias)
        assert row(alias).next_run_at == T0 + 2 * MINUTE
        late = schedules._fire(stale, T0, storage, alias, schedules.GRACE, {})
        assert late == []  # the same id again: enqueue stored nothing
        # Its compare-and-set found next_run_at moved on: no step back to T0 + 1 min (which
        # would fire that tick a second time once its job is gone).
        assert row(alias).next_run_at == T0 + 2 * MINUTE
        assert job_count(storage) == 2

    def test_a_broken_schedule_does_not_stop_the_others(self, storage, alias, caplog):
        make(alias, "broken", interval=60, next_run_at=T0)
        make(alias, "fine", interval=60, next_run_at=T0)
        Schedule.objects.using(alias).filter(name="broken").update(interval=None, cron="nope")
        with caplog.at_level(logging.WARNING, logger="django_jobq.schedules"):
            fired = fire_due(now=T0, storage=storage, using=alias)
        assert fired == [tick_job_id("fine", T0)]
        assert "'broken' not fired" in caplog.text
        assert row(alias, "broken").next_run_at == T0

    def test_fire_now_uses_a_manual_id(self, storage, alias):
        make(alias, interval=60, next_run_at=T0)
        result = fire_now(row(alias), storage=storage, using=alias, now=T0)
        assert result.job_id == f"schedule.s.manual-{int(T0.timestamp() * 1000)}"
        assert result.created
        assert row(alias).next_run_at == T0  # the regular ticks are not affected
        assert row(alias).last_job_id == result.job_id

    def test_threads_fire_each_tick_exactly_once(self, storage, alias):
        make(alias, interval=10, next_run_at=T0)
        make(alias, "cron", cron="* * * * *", next_run_at=T0)
        sweeps = [T0 + k * 3 * SECOND for k in range(41)]  # two minutes of sweeps
        n_threads = 6
        barrier = threading.Barrier(n_threads, timeout=60)
        results: list[list[str]] = []
        errors: list[BaseException] = []

        def reaper() -> None:
            mine: list[str] = []
            try:
                for now in sweeps:
                    barrier.wait()  # every thread sweeps the same instant together
                    mine += fire_due(now=now, storage=storage, using=alias)
                results.append(mine)
            except BaseException as exc:  # reported below, never swallowed
                errors.append(exc)
                barrier.abort()
            finally:
                connections.close_all()

        threads = [threading.Thread(target=reaper) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len(results) == n_threads
        fired = Counter(i for mine in results for i in mine)
        expected = [tick_job_id("s", T0 + k * 10 * SECOND) for k in range(13)]
        expected += [tick_job_id("cron", T0 + k * MINUTE) for k in range(3)]
        assert sorted(fired) == sorted(expected)
        assert set(fired.values()) == {1}  # each tick stored by one thread only
        assert job_count(storage) == len(expected)
        assert row(alias).next_run_at == T0 + 130 * SECOND
        assert row(alias, "cron").next_run_at == T0 + 3 * MINUTE


# -- the reaper -----------------------------------------------------------------------------


@ON_DEFAULT_DB
class TestReaperHook:
    def reaper(self, storage, **kwargs) -> Reaper:
        return Reaper([Q], storage=storage, mirror=False, retention_days=None, **kwargs)

    def test_each_sweep_fires_due_schedules(self, storage, alias):
        due = dt.datetime.now(UTC).replace(microsecond=0) - SECOND
        make(alias, interval=3600, next_run_at=due)
        reaper = self.reaper(storage)
        assert Q in reaper.run_once()
        assert reaper.last_fired == [tick_job_id("s", due)]
        assert row(alias).next_run_at == due + HOUR

    def test_schedules_can_be_turned_off(self, storage, alias):
        due = dt.datetime.now(UTC).replace(microsecond=0) - SECOND
        make(alias, interval=3600, next_run_at=due)
        reaper = self.reaper(storage, schedules=False)
        reaper.run_once()
        assert reaper.last_fired == []
        assert row(alias).next_run_at == due
        assert job_count(storage) == 0

    def test_a_schedule_failure_never_stops_stall_recovery(self, storage, monkeypatch, caplog):
        def broken(**_):
            raise RuntimeError("schedule table is gone")

        monkeypatch.setattr(schedules, "fire_due", broken)
        Queue(Q, storage=storage).enqueue("plain", 1)
        reaper = self.reaper(storage)
        with caplog.at_level(logging.WARNING, logger="django_jobq.reaper"):
            reports = reaper.run_once()
            reaper.run_once()
        assert Q in reports
        assert caplog.text.count("schedule table is gone") == 1  # not once per sweep


# -- separate reaper processes ----------------------------------------------------------------


def log_of(proc) -> str:
    return Path(proc.log_path).read_text()


FIRED_BY = r" (\d+) schedule 'proc' fired"


def run_three_reapers(spawner: Spawner, storage, alias: str) -> None:
    """Three runreaper processes race for a 1-second interval schedule; every tick up to where
    they stopped must be stored exactly once, by exactly one of them."""
    reapers = [spawner("runreaper", "--interval", "0.05", log=f"reaper{i}") for i in range(3)]
    # All three sweeping (and so handling SIGTERM) before the first tick: on a loaded machine
    # Django's start-up takes seconds, and a race that one process runs alone proves nothing.
    up = lambda: all("reaper sweeping every" in log_of(p) for p in reapers)  # noqa: E731
    assert wait_until(up, PROCESS_START), [log_of(p) for p in reapers]
    start = dt.datetime.now(UTC).replace(microsecond=0) + 2 * SECOND
    make(alias, "proc", interval=1, next_run_at=start)

    # Ten ticks, and at least two of the processes among the winners: on a loaded machine one
    # process can win many races in a row, so the test waits for the second winner (an event)
    # instead of betting on the odds of ten ticks.
    def raced() -> bool:
        logs = "".join(log_of(p) for p in reapers)
        return job_count(storage) >= 10 and len(set(re.findall(FIRED_BY, logs))) > 1

    assert wait_until(raced, PROCESS_START), [p.poll() for p in reapers]
    Schedule.objects.using(alias).filter(name="proc").update(enabled=False)
    spawner.stop_all()
    assert [p.returncode for p in reapers] == [0, 0, 0]

    end = row(alias, "proc").next_run_at
    n = int((end - start).total_seconds())
    expected = {tick_job_id("proc", start + k * SECOND) for k in range(n)}
    assert n >= 10
    assert stored_ids(storage, expected) == expected
    assert job_count(storage) == n
    logs = "".join(log_of(p) for p in reapers)
    fired = Counter(re.findall(r"fired tests-sched/(schedule\.proc\.\d+)", logs))
    assert set(fired) == expected
    assert set(fired.values()) == {1}
    # More than one process did fire: the race was real.
    pids = set(re.findall(FIRED_BY, logs))
    assert len(pids) > 1, logs


@pytest.mark.slow
@pytest.mark.redis
@ON_DEFAULT_DB
def test_three_reaper_processes_on_redis(redis_client, redis_prefix, tmp_path):
    spawner = Spawner(
        tmp_path,
        {
            "JOBQ_TEST_PREFIX": redis_prefix,
            # The reapers read schedules from this test's (committed) SQLite database.
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        },
    )
    try:
        run_three_reapers(spawner, RedisStorage(redis_client, prefix=redis_prefix), "default")
    finally:
        spawner.stop_all()


class TestDatabaseProcesses:
    @pytest.fixture(params=["sqlite", "postgres"])
    def backend(self, request):
        if request.param == "postgres":
            request.applymarker(pytest.mark.postgres)
        return request.param

    @pytest.mark.slow
    def test_three_reaper_processes_on_the_database_backend(self, live_storage, tmp_path):
        spawner = Spawner(
            tmp_path,
            {
                "JOBQ_TEST_BACKEND": "database",
                "JOBQ_TEST_DB_ALIAS": live_storage.using,
                "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
                "JOBQ_TEST_PG_DB": str(connections["pg"].settings_dict["NAME"]),
            },
        )
        try:
            run_three_reapers(spawner, live_storage, live_storage.using)
        finally:
            spawner.stop_all()


# -- admin and command ------------------------------------------------------------------------


@pytest.fixture
def jobq_on_redis(settings, redis_client, redis_prefix) -> RedisStorage:
    """The configured storage (what the admin and the command use) on this test's prefix."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix}
    return RedisStorage(redis_client, prefix=redis_prefix)


FORM = {
    "name": "nightly",
    "queue": Q,
    "cron": "0 3 * * *",
    "interval": "",
    "timezone": "Europe/Berlin",
    "payload": '{"report": "daily"}',
    "job_options": '{"priority": 5}',
    "enabled": "on",
    "missed": "skip",
}


@pytest.mark.redis
@pytest.mark.django_db(databases=["default"])
class TestAdmin:
    add_url = "admin:django_jobq_schedule_add"

    def post_add(self, client, **changes):
        return client.post(reverse(self.add_url), {**FORM, **changes})

    def test_add_computes_next_run(self, admin_client):
        response = self.post_add(admin_client)
        assert response.status_code == 302, response.content.decode()[:2000]
        s = Schedule.objects.get(name="nightly")
        assert (s.payload, s.job_options) == ({"report": "daily"}, {"priority": 5})
        assert s.next_run_at.astimezone(BERLIN).hour == 3

    def test_blank_json_boxes_mean_empty_objects(self, admin_client):
        response = self.post_add(admin_client, payload="", job_options="")
        assert response.status_code == 302
        s = Schedule.objects.get(name="nightly")
        assert (s.payload, s.job_options) == ({}, {})

    @pytest.mark.parametrize(
        ("changes", "field", "fragment"),
        [
            ({"cron": "0 25 * * *"}, "cron", "25 is out of range 0-23"),
            ({"cron": "0 3 * *"}, "cron", "expected 5"),
            ({"interval": "60"}, "interval", "exactly one of cron and interval"),
            ({"cron": ""}, "cron", "exactly one of cron and interval"),
            ({"timezone": "Europe/Atlantis"}, "timezone", "Unknown time zone"),
            ({"job_options": '{"priority": 99999}'}, "job_options", "priority must be between"),
            ({"job_options": '{"colour": "red"}'}, "job_options", "colour"),
            ({"job_options": "{not json"}, "job_options", "Enter a valid JSON"),
            ({"name": "no spaces please"}, "name", "A-Z a-z 0-9"),
            ({"queue": "a:b"}, "queue", "invalid queue name"),
        ],
    )
    def test_add_form_errors_sit_on_their_field(self, admin_client, changes, field, fragment):
        response = self.post_add(admin_client, **changes)
        assert response.status_code == 200
        errors = response.context["adminform"].form.errors
        assert field in errors, errors
        assert any(fragment in e for e in errors[field]), errors
        assert not Schedule.objects.exists()

    def test_change_form_validates_and_recomputes(self, admin_client):
        s = Schedule.objects.create(name="nightly", queue=Q, cron="0 3 * * *", next_run_at=T0)
        url = reverse("admin:django_jobq_schedule_change", args=[s.pk])
        bad = admin_client.post(url, {**FORM, "cron": "0 3 31 2 *"})
        assert bad.status_code == 200
        assert "never fires" in str(bad.context["adminform"].form.errors["cron"])
        assert Schedule.objects.get(pk=s.pk).cron == "0 3 * * *"
        good = admin_client.post(url, {**FORM, "cron": "15 4 * * *"})
        assert good.status_code == 302
        s.refresh_from_db()
        local = s.next_run_at.astimezone(BERLIN)
        assert (local.hour, local.minute) == (4, 15)

    def test_list_and_actions(self, admin_client, jobq_on_redis):
        s = Schedule.objects.create(name="nightly", queue=Q, interval=3600, next_run_at=T0)
        changelist = reverse("admin:django_jobq_schedule_changelist")
        page = admin_client.get(changelist, {"q": "night"})
        assert page.status_code == 200 and "every 1h" in page.content.decode()

        admin_client.post(changelist, {"action": "disable_schedules", "_selected_action": [s.pk]})
        assert not Schedule.objects.get(pk=s.pk).enabled
        admin_client.post(changelist, {"action": "enable_schedules", "_selected_action": [s.pk]})
        s.refresh_from_db()
        assert s.enabled and s.next_run_at > dt.datetime.now(UTC)  # re-timed, not "missed"

        response = admin_client.post(
            changelist, {"action": "run_now", "_selected_action": [s.pk]}, follow=True
        )
        s.refresh_from_db()
        assert re.fullmatch(r"schedule\.nightly\.manual-\d{13}", s.last_job_id)
        link = reverse("admin:django_jobq_job_by_id", args=[Q, s.last_job_id])
        assert f'enqueued <a href="{link}">{Q}/{s.last_job_id}</a>' in response.content.decode()
        assert jobq_on_redis.get_record(Q, s.last_job_id) is not None

    def test_actions_need_the_change_permission(self, client, django_user_model, jobq_on_redis):
        from django.contrib.auth.models import Permission

        user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_schedule"))
        client.force_login(user)
        s = Schedule.objects.create(name="nightly", queue=Q, interval=3600, next_run_at=T0)
        changelist = reverse("admin:django_jobq_schedule_changelist")
        assert client.get(changelist).status_code == 200
        client.post(changelist, {"action": "run_now", "_selected_action": [s.pk]})
        client.post(changelist, {"action": "disable_schedules", "_selected_action": [s.pk]})
        s.refresh_from_db()
        assert (s.enabled, s.last_job_id) == (True, "")
        assert job_count(jobq_on_redis) == 0
        assert client.post(reverse(self.add_url), FORM).status_code == 403


@pytest.mark.redis
@pytest.mark.django_db(databases=["default"])
class TestCommand:
    def run(self, *args) -> str:
        out = io.StringIO()
        call_command("jobq_schedules", *args, stdout=out)
        return out.getvalue()

    def test_lists_next_runs_in_the_schedule_zone(self, jobq_on_redis):
        assert self.run().strip() == "no schedules"
        Schedule.objects.create(
            name="nightly", queue=Q, cron="0 3 * * *", timezone="Europe/Berlin",
            next_run_at=dt.datetime(2020, 1, 8, 2, tzinfo=UTC),  # past: no reaper ran
        )  # fmt: skip
        Schedule.objects.create(
            name="often", queue=Q, interval=90, next_run_at=utc(2020, 1, 1), enabled=False
        )
        lines = self.run("--upcoming", "3").splitlines()
        assert lines[0].split() == [
            "NAME", "QUEUE", "WHEN", "TIMEZONE", "ENABLED", "NEXT", "RUN", "LAST", "RUN", "LAST",
            "JOB",
        ]  # fmt: skip
        assert lines[1].split()[:6] == [
            "nightly", Q, "0", "3", "*", "*",
        ]  # fmt: skip
        assert "2020-01-08T03:00:00+01:00 (due)" in lines[1]
        assert lines[2].strip() == "2020-01-09T03:00:00+01:00"
        assert lines[3].strip() == "2020-01-10T03:00:00+01:00"
        assert lines[4].split()[:5] == ["often", Q, "every", "90s", "UTC"]
        assert "no" in lines[4].split()
        assert "(due)" not in lines[4]  # disabled: nothing will fire it

    def test_fire_now(self, jobq_on_redis):
        Schedule.objects.create(name="nightly", queue=Q, cron="0 3 * * *", next_run_at=T0)
        output = self.run("--fire-now", "nightly")
        match = re.fullmatch(rf"{Q}/(schedule\.nightly\.manual-\d+): queued\n", output)
        assert match, output
        assert jobq_on_redis.get_record(Q, match.group(1)) is not None
        with pytest.raises(CommandError, match="no schedule named 'nope'"):
            self.run("--fire-now", "nope")

    def test_runreaper_once_without_schedules(self, jobq_on_redis):
        due = dt.datetime.now(UTC).replace(microsecond=0) - SECOND
        Schedule.objects.create(name="due", queue=Q, interval=60, next_run_at=due)
        out = io.StringIO()
        call_command("runreaper", Q, "--once", "--no-schedules", "--no-mirror", stdout=out)
        assert "schedules" not in out.getvalue()
        assert job_count(jobq_on_redis) == 0
        call_command("runreaper", Q, "--once", "--no-mirror", stdout=out)
        assert f"schedules: fired {tick_job_id('due', due)}" in out.getvalue()
        assert job_count(jobq_on_redis) == 1


def test_fire_due_needs_an_aware_now():
    with pytest.raises(ValueError, match="timezone-aware"):
        fire_due(now=dt.datetime(2030, 1, 1), storage=object(), using="default")  # noqa: DTZ001
