"""Periodic jobs: validating a ``Schedule``, computing its ticks, and firing the due ones.

Exactly once per tick, with any number of reapers firing at once, rests on two things:

1. Each tick is enqueued under the id ``schedule.<name>.<tick epoch seconds>``. Enqueue
   deduplicates by id, so two reapers firing the same tick store one job.
2. ``next_run_at`` moves on with a compare-and-set UPDATE (``WHERE pk = … AND next_run_at =
   <the value read>``): only one reaper advances a tick; a slower one that read the same value
   finds no row to update and stops, having at most re-sent a duplicate id.

The enqueue comes before the advance, so a reaper that dies between the two leaves the tick
due: the next sweep sends the same id again (a no-op if it was stored) and advances it.

A tick more than ``grace`` in the past when it is looked at is *missed* (the reapers were down):
``skip`` drops missed ticks and moves on to the first tick that is not missed; ``run_once``
fires one job, under the most recent due tick's id, for all of them. Ticks within the grace are
fired one by one, so a reaper that was busy for a few seconds catches up without losing any.
See docs/schedules.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import zoneinfo
from collections.abc import Iterable
from typing import Any, cast

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.signals import pre_save
from django.dispatch import receiver
from django.utils import timezone as dj_timezone

from ..backend import get_storage
from ..conf import OPTION_NAMES, jobq_settings
from ..errors import JobQError, PayloadTooLarge, SerializationError
from ..job import EnqueueResult
from ..models import Schedule
from ..queue.core import Queue
from ..storage.base import Storage
from ..validation import (
    JOB_ID_MAX_LENGTH,
    MAX_DURATION_MS,
    validate_job_id,
    validate_queue_name,
)
from .cron import parse_cron

logger = logging.getLogger("django_jobq.schedules")

# A tick more than this far in the past is "missed" (see the module docstring). The reaper
# passes max(GRACE, 2 * its interval), so a slow sweep never counts as downtime.
GRACE = dt.timedelta(seconds=60)
# Ticks one schedule may fire in one call; the rest wait for the next sweep, so a tiny interval
# after a long pause cannot hold the reaper (and its stall recovery) for long.
MAX_TICKS_PER_CALL = 100
# Job options a schedule may set: the per-job options, plus those that make sense for a job
# whose id is new on every tick (update_*, singleton and run_at do not).
SCHEDULE_JOB_OPTIONS = frozenset(OPTION_NAMES) | {
    "delay",
    "lifo",
    "group",
    "dedup_key",
    "dedup_mode",
    "dedup_ttl",
    # The envelope meta: a task function's schedule names its task there (schedule_sync).
    "meta",
}
MAX_INTERVAL_SECONDS = MAX_DURATION_MS // 1000
_TIMING_FIELDS = ("cron", "interval", "timezone", "enabled")
# The longest id a schedule makes is a "run now" one in year 9999; it must stay a valid job id.
_LAST_MANUAL_SUFFIX = f".manual-{int(dt.datetime(9999, 12, 31, tzinfo=dt.UTC).timestamp() * 1000)}"
NAME_MAX_LENGTH = JOB_ID_MAX_LENGTH - len("schedule.") - len(_LAST_MANUAL_SUFFIX)


class _BuildOnly:
    """Stands in for a storage in a Queue used only to validate with ``Queue.build``, which
    never touches storage: validating a form must not need a reachable backend."""


_BUILD_ONLY = cast(Storage, _BuildOnly())


def tick_job_id(name: str, tick: dt.datetime) -> str:
    return f"schedule.{name}.{int(tick.timestamp())}"


def manual_job_id(name: str, at: dt.datetime) -> str:
    return f"schedule.{name}.manual-{int(at.timestamp() * 1000)}"


def schedules_alias(storage: Storage) -> str:
    """The database alias schedules live on: the database backend's own, else the mirror's
    (the alias the reaper already purges)."""
    return getattr(storage, "using", None) or jobq_settings()["MIRROR"]["DATABASE_ALIAS"]


# -- validation -----------------------------------------------------------------------------


def validate_schedule(schedule: Schedule) -> None:
    """Raise ``ValidationError`` with one message per field at fault (what the admin form
    shows next to the field)."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    name = schedule.name
    try:
        validate_job_id(name)
        valid_name = len(name) <= NAME_MAX_LENGTH
    except JobQError:
        valid_name = False
    if not valid_name:
        add(
            "name",
            f"Use 1-{NAME_MAX_LENGTH} characters of A-Z a-z 0-9 _ . - , not starting with . or -"
            f" (the name becomes part of every job id), got {name!r}.",
        )
    queue_ok = True
    try:
        validate_queue_name(schedule.queue)
    except JobQError as exc:
        queue_ok = False
        add("queue", str(exc))

    if schedule.cron is not None and not isinstance(schedule.cron, str):
        add("cron", f"Cron must be a string, got {schedule.cron!r}.")
        schedule_cron = ""
    else:
        schedule_cron = schedule.cron or ""
    cron = schedule_cron.strip()
    interval = schedule.interval
    if bool(cron) == (interval is not None):
        message = "Give exactly one of cron and interval."
        add("cron", message)
        add("interval", message)
    elif cron:
        try:
            parse_cron(cron)
        except ValueError as exc:
            add("cron", str(exc))
    elif isinstance(interval, bool) or not isinstance(interval, int):
        add("interval", f"Interval must be a whole number of seconds, got {interval!r}.")
    elif not 1 <= interval <= MAX_INTERVAL_SECONDS:
        add("interval", f"Interval must be between 1 and {MAX_INTERVAL_SECONDS} seconds.")

    try:
        zone(schedule.timezone)
    except ValueError as exc:
        add("timezone", str(exc))

    if schedule.missed not in Schedule.Missed.values:
        add("missed", f"Missed-tick policy must be one of {', '.join(Schedule.Missed.values)}.")

    options = schedule.job_options
    if not isinstance(options, dict):
        add("job_options", "Job options must be a JSON object.")
    else:
        unknown = set(options) - SCHEDULE_JOB_OPTIONS
        if unknown:
            add(
                "job_options",
                f"Unknown or unsupported job option(s) {sorted(unknown)}; allowed:"
                f" {', '.join(sorted(SCHEDULE_JOB_OPTIONS))}.",
            )
        elif "meta" in options and not isinstance(options["meta"], dict):
            add("job_options", f"meta must be a JSON object, got {options['meta']!r}.")
        elif queue_ok:
            try:
                Queue(schedule.queue, storage=_BUILD_ONLY).build(
                    "schedule.validation", schedule.payload, **options
                )
            except (PayloadTooLarge, SerializationError) as exc:
                add("payload", str(exc))
            except JobQError as exc:
                add("job_options", str(exc))
    if errors:
        raise ValidationError(errors)


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``; ``ValueError`` when there is no such zone."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"Unknown time zone {name!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'."
        ) from None


# -- ticks ----------------------------------------------------------------------------------


def next_tick(schedule: Schedule, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after ``after`` (aware, UTC)."""
    if schedule.cron:
        tz = zone(schedule.timezone)
        return parse_cron(schedule.cron.strip()).next_after(after, tz).astimezone(dt.UTC)
    if not schedule.interval:
        raise ValueError(f"schedule {schedule.name!r} has neither cron nor interval")
    step = dt.timedelta(seconds=schedule.interval)
    anchor = schedule.next_run_at
    if anchor is None:
        return _ceil_second(after) + step
    # Interval ticks lie on the grid anchor + k * interval (k of any sign): the first one
    # after ``after``. Floor division of timedeltas is exact.
    return (anchor + ((after - anchor) // step + 1) * step).astimezone(dt.UTC)


def first_run(schedule: Schedule, now: dt.datetime) -> dt.datetime:
    """``next_run_at`` of a new or re-timed schedule: the next cron tick, or one interval
    from now."""
    if schedule.cron:
        return next_tick(schedule, now)
    return _ceil_second(now) + dt.timedelta(seconds=cast(int, schedule.interval))


def latest_tick(schedule: Schedule, since: dt.datetime, now: dt.datetime) -> dt.datetime:
    """The most recent tick at or before ``now``, given that ``since`` is a tick <= now.

    Cron has no "previous tick", so this looks back in widening windows and walks forward
    inside the first window that holds a tick: a few lookups whatever the downtime was."""
    if not schedule.cron:
        step = dt.timedelta(seconds=cast(int, schedule.interval))
        return since + ((now - since) // step) * step
    tiny = dt.timedelta(microseconds=1)
    for back in (2 * 60, 3600, 86_400, 32 * 86_400, 367 * 86_400, 9 * 366 * 86_400):
        start = max(since, now - dt.timedelta(seconds=back))
        tick = next_tick(schedule, start - tiny)
        if tick <= now:
            break
    else:
        tick = since
    while (following := next_tick(schedule, tick)) <= now:
        tick = following
    return tick


def _ceil_second(at: dt.datetime) -> dt.datetime:
    at = at.astimezone(dt.UTC)
    whole = at.replace(microsecond=0)
    return whole if whole == at else whole + dt.timedelta(seconds=1)


# -- firing ---------------------------------------------------------------------------------


def fire_due(
    now: dt.datetime | None = None,
    storage: Storage | None = None,
    using: str | None = None,
    *,
    grace: dt.timedelta | None = None,
) -> list[str]:
    """Fire every enabled schedule whose ``next_run_at <= now``; give ``next_run_at`` to those
    without one. Returns the ids of the jobs this call stored (a tick another reaper stored
    first is not in the list).

    One schedule failing (say, a cron edited to garbage in SQL) is logged and the others
    still fire."""
    storage = storage if storage is not None else get_storage()
    using = using or schedules_alias(storage)
    now = now if now is not None else dj_timezone.now()
    if now.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    grace = GRACE if grace is None else grace
    due = (
        Schedule.objects.using(using)
        .filter(enabled=True)
        .filter(Q(next_run_at__lte=now) | Q(next_run_at__isnull=True))
        .order_by("next_run_at", "pk")
    )
    queues: dict[str, Queue] = {}
    stored: list[str] = []
    for schedule in due:
        try:
            stored += _fire(schedule, now, storage, using, grace, queues)
        except Exception as exc:
            # Once per failure of this version of the schedule: not on every sweep.
            _warn_now_and_then(
                f"{using}:{schedule.pk}:{schedule.updated_at}:{exc}",
                "schedule %r not fired: %s",
                schedule.name,
                exc,
            )
    return stored


def _fire(
    schedule: Schedule,
    now: dt.datetime,
    storage: Storage,
    using: str,
    grace: dt.timedelta,
    queues: dict[str, Queue],
) -> list[str]:
    rows = Schedule.objects.using(using)
    old = schedule.next_run_at
    if old is None:
        rows.filter(pk=schedule.pk, next_run_at__isnull=True).update(
            next_run_at=first_run(schedule, now)
        )
        return []
    stored = []
    for _ in range(MAX_TICKS_PER_CALL):
        if old > now:
            break
        if now - old <= grace:
            tick: dt.datetime | None = old
        elif schedule.missed == Schedule.Missed.RUN_ONCE:
            tick = latest_tick(schedule, old, now)
        else:
            tick = None
        if tick is not None:
            new = next_tick(schedule, tick)
        else:
            # skip: on to the first tick that is not missed (it may be due already).
            new = next_tick(schedule, now - grace - dt.timedelta(microseconds=1))
            logger.info(
                "schedule %r: skipped ticks from %s to before %s (missed)",
                schedule.name,
                old.isoformat(),
                new.isoformat(),
            )
        changes: dict[str, Any] = {"next_run_at": new}
        if tick is not None:
            queue = queues.get(schedule.queue)
            if queue is None:
                queue = queues[schedule.queue] = Queue(schedule.queue, storage=storage)
            job_id = tick_job_id(schedule.name, tick)
            result = queue.enqueue(job_id, schedule.payload, **schedule.job_options)
            if result.created:
                stored.append(job_id)
                logger.info("schedule %r fired %s/%s", schedule.name, schedule.queue, job_id)
            changes.update(last_run_at=now, last_job_id=job_id)
        if not rows.filter(pk=schedule.pk, next_run_at=old).update(**changes):
            break  # another reaper advanced this tick first (or the schedule was edited)
        old = new
    return stored


def fire_now(
    schedule: Schedule,
    *,
    storage: Storage | None = None,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> EnqueueResult:
    """Enqueue one extra run now, under ``schedule.<name>.manual-<epoch ms>``; the regular
    ticks are not affected."""
    storage = storage if storage is not None else get_storage()
    now = now if now is not None else dj_timezone.now()
    job_id = manual_job_id(schedule.name, now)
    result = Queue(schedule.queue, storage=storage).enqueue(
        job_id, schedule.payload, **schedule.job_options
    )
    Schedule.objects.using(using or schedule._state.db or schedules_alias(storage)).filter(
        pk=schedule.pk
    ).update(last_run_at=now, last_job_id=job_id)
    return result


def describe(schedule: Schedule) -> str:
    """``cron`` as written, or the interval in words (lists and the admin)."""
    if schedule.cron:
        return schedule.cron
    if schedule.interval is None:
        return "-"
    seconds = schedule.interval
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"every {seconds // size}{unit}"
    return f"every {seconds}s"


# -- keeping next_run_at right ---------------------------------------------------------------


@receiver(pre_save, sender=Schedule, dispatch_uid="django_jobq.schedules.retime")
def _retime_on_save(
    sender: type[Schedule],
    instance: Schedule,
    raw: bool = False,
    using: str | None = None,
    update_fields: Iterable[str] | None = None,
    **kwargs: Any,
) -> None:
    """A schedule without ``next_run_at`` (new, or cleared) gets one; so does one whose cron,
    interval or timezone changed, or that was enabled again: ticks of the old timing (or from
    while it was off) must not fire as "missed". A new row given a ``next_run_at`` keeps it."""
    if raw or (update_fields is not None and "next_run_at" not in update_fields):
        return
    retime = instance.next_run_at is None
    if not retime and instance.pk is not None:
        before = sender.objects.using(using).filter(pk=instance.pk).values(*_TIMING_FIELDS).first()
        retime = (
            before is not None
            and instance.enabled
            and any(before[f] != getattr(instance, f) for f in _TIMING_FIELDS)
        )
    if retime:
        try:
            instance.next_run_at = first_run(instance, dj_timezone.now())
        except (ValueError, TypeError):
            # An invalid schedule saved from code: nothing to compute; fire_due reports it.
            instance.next_run_at = None


_last_warned: dict[str, float] = {}


def _warn_now_and_then(key: str, message: str, *args: Any, every: float = 600.0) -> None:
    """Log a recurring failure once per ``every`` seconds rather than on every sweep."""
    now = time.monotonic()
    if now - _last_warned.get(key, -math.inf) >= every:
        if len(_last_warned) > 1000:
            _last_warned.clear()
        _last_warned[key] = now
        logger.warning(message, *args)
    else:
        logger.debug(message, *args)
