"""Schedules declared in ``JOBQ["SCHEDULES"]``, kept in step with ``Schedule`` rows.

Settings are code: they ship with a deploy, so a schedule declared there should exist after
the deploy without anyone clicking in the admin, and one removed from there should stop. The
reaper (on start and every ``REAPER["schedule_sync_interval"]`` seconds) and ``manage.py
jobq_schedules --sync`` call :func:`sync`, which:

- creates the declared schedules that have no row (marked ``source="settings"``);
- updates settings rows whose declaration changed (a timing change re-times the row, as an
  admin edit does);
- deletes settings rows no longer declared (the jobs they already enqueued are untouched);
- never touches a row made in the admin, API or code (``source="admin"``): a declaration
  whose (queue, name) is taken by one is reported as a conflict and not applied.

Each settings row keeps a digest of the fields as the sync last wrote them. A row whose fields
no longer match it was edited since (in the admin, say): that is *drift*, logged by every sync
that sees it and shown on the schedule's admin page, and the sync writes the settings back —
settings win.

Nothing is synced while any declaration is invalid (the system check reports the same
errors): a half-applied schedule list is worse than the previous one.

Idempotent and safe with several reapers at once: the (queue, name) unique constraint turns a
second create into an ``IntegrityError`` that is taken as "already there"; updates write the
same values; deletes of rows already gone delete nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from ..backend import get_storage
from ..conf import jobq_settings
from ..errors import ConfigurationError, JobQError
from ..models import Schedule
from ..serde import check_json_value
from .core import schedules_alias, validate_schedule

logger = logging.getLogger("django_jobq.schedules")

SETTINGS = "settings"
DECLARATION_KEYS = frozenset(
    {"queue", "task", "cron", "interval", "timezone", "payload", "args", "kwargs", "options",
     "missed", "enabled"}
)  # fmt: skip
# The fields a declaration sets; the digest covers exactly these.
MANAGED_FIELDS = (
    "queue", "cron", "interval", "timezone", "payload", "job_options", "missed", "enabled"
)  # fmt: skip


@dataclass
class SyncReport:
    """What one sync did, by schedule name (``queue/name`` for deleted and conflicting rows)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)

    def __str__(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("created", self.created),
                ("updated", self.updated),
                ("deleted", self.deleted),
                ("drifted (settings written back)", self.drifted),
                ("conflicts (admin rows left alone)", self.conflicts),
            )
            if names
        ]
        return "; ".join(parts) or f"{len(self.unchanged)} unchanged"


def digest(schedule: Schedule) -> str:
    """A stable digest of the fields a declaration sets (key order of JSON objects does not
    matter: the database may return them reordered)."""
    values = {name: getattr(schedule, name) for name in MANAGED_FIELDS}
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def is_drifted(schedule: Schedule) -> bool:
    """A settings row edited since the sync last wrote it."""
    return schedule.source == SETTINGS and digest(schedule) != schedule.settings_digest


def declared_schedules() -> tuple[list[Schedule], list[str]]:
    """The unsaved rows ``JOBQ["SCHEDULES"]`` declares, and one message per problem (each
    naming the schedule and the key at fault). Rows are only meaningful without problems."""
    raw = jobq_settings()["SCHEDULES"]
    if not isinstance(raw, dict):
        return [], [f"JOBQ['SCHEDULES'] must be a dict of name -> schedule, got {raw!r}"]
    rows: list[Schedule] = []
    problems: list[str] = []
    for name, spec in raw.items():
        where = f"JOBQ['SCHEDULES'][{name!r}]"
        try:
            rows.append(_declared(name, spec, where))
        except _Invalid as exc:
            problems.extend(exc.problems)
    return rows, problems


class _Invalid(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _declared(name: Any, spec: Any, where: str) -> Schedule:
    if not isinstance(name, str):
        raise _Invalid([f"{where}: the name must be a string"])
    if not isinstance(spec, dict):
        raise _Invalid([f"{where}: must be a dict (task or queue, cron or interval, ...)"])
    unknown = set(spec) - DECLARATION_KEYS
    if unknown:
        raise _Invalid(
            [f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(DECLARATION_KEYS)}"]
        )
    options = spec.get("options", {})
    if not isinstance(options, dict):
        raise _Invalid([f"{where}: 'options' must be a dict of job options, got {options!r}"])
    if "meta" in options and not isinstance(options["meta"], dict):
        raise _Invalid([f"{where}: options: 'meta' must be a dict, got {options['meta']!r}"])
    for key in ("cron", "timezone", "missed"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise _Invalid([f"{where}: {key!r} must be a string, got {spec[key]!r}"])
    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _Invalid([f"{where}: 'enabled' must be True or False, got {enabled!r}"])
    if "task" in spec:
        if "payload" in spec:
            raise _Invalid([f"{where}: a task schedule takes 'args'/'kwargs', not 'payload'"])
        queue, payload, options = _task_call(spec, options, where)
    else:
        if "args" in spec or "kwargs" in spec:
            raise _Invalid([f"{where}: 'args'/'kwargs' need 'task' (use 'payload' for a queue)"])
        if "queue" not in spec:
            raise _Invalid([f"{where}: give 'task' (a task function's name) or 'queue'"])
        queue, payload = spec["queue"], spec.get("payload", {})
        if payload is None:
            # The row's JSON column stores None as SQL NULL, which it refuses.
            raise _Invalid([f"{where}: 'payload' cannot be None (omit it for {{}})"])
    for label, value in (("payload", payload), ("options", options)):
        try:
            check_json_value(value, label)
        except JobQError as exc:
            raise _Invalid([f"{where}: {label}: {exc}"]) from None
    schedule = Schedule(
        name=name,
        queue=queue,
        cron=spec.get("cron") or "",
        interval=spec.get("interval"),
        timezone=spec.get("timezone", "UTC"),
        payload=payload,
        job_options=options,
        missed=spec.get("missed", Schedule.Missed.SKIP),
        enabled=enabled,
        source=SETTINGS,
    )
    try:
        validate_schedule(schedule)
    except ValidationError as exc:
        # One line per message: "give exactly one of cron and interval" sits on both fields.
        fields: dict[str, list[str]] = {}
        for key, messages in exc.message_dict.items():
            for message in messages:
                fields.setdefault(message, []).append(key)
        raise _Invalid([f"{where}: {', '.join(k)}: {m}" for m, k in fields.items()]) from None
    return schedule


def _task_call(
    spec: dict[str, Any], options: dict[str, Any], where: str
) -> tuple[str, Any, dict[str, Any]]:
    """(queue, payload, job options) of a task function's schedule, exactly as
    ``fn.enqueue(*args, **kwargs)`` would build them: the arguments are checked against the
    signature now, not at the first tick."""
    from ..tasks.registry import registry, route

    name = spec["task"]
    task = registry.task(name) if isinstance(name, str) else None
    if task is None:
        known = ", ".join(t.name for t in registry.tasks()) or "none"
        raise _Invalid([f"{where}: unknown task {name!r} (registered tasks: {known})"])
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        raise _Invalid([f"{where}: 'args' must be a list and 'kwargs' a dict"])
    try:
        payload, task_options = task._call(tuple(args), kwargs)
    except JobQError as exc:
        raise _Invalid([f"{where}: {exc}"]) from None
    meta = {**(task_options.get("meta") or {}), **(options.get("meta") or {})}
    merged = {**task_options, **options, "meta": meta}
    queue = spec.get("queue") or route(task.name, task.queue)
    return queue, payload, merged


def check_declared() -> list[str]:
    """The problems of ``JOBQ["SCHEDULES"]`` (the system check's source)."""
    return declared_schedules()[1]


def sync(using: str | None = None) -> SyncReport:
    """Bring the settings rows of database ``using`` in line with ``JOBQ["SCHEDULES"]``.

    Raises ``ConfigurationError`` (nothing written) when a declaration is invalid."""
    declared, problems = declared_schedules()
    if problems:
        raise ConfigurationError("JOBQ['SCHEDULES'] not synced: " + "; ".join(problems))
    using = using or schedules_alias(get_storage())
    rows = Schedule.objects.using(using)
    report = SyncReport()
    for wanted in declared:
        wanted.settings_digest = digest(wanted)
        label = wanted.name
        row = rows.filter(queue=wanted.queue, name=wanted.name).first()
        if row is None:
            try:
                with transaction.atomic(using=using):
                    wanted.save(using=using)
            except IntegrityError:
                # Another reaper created it between our read and write (or an admin row
                # appeared): the next sync compares it like any other row. Any other
                # integrity error is not ours to hide.
                if not rows.filter(queue=wanted.queue, name=wanted.name).exists():
                    raise
                report.unchanged.append(label)
            else:
                report.created.append(label)
            continue
        if row.source != SETTINGS:
            report.conflicts.append(f"{row.queue}/{row.name}")
            logger.warning(
                "JOBQ['SCHEDULES'][%r]: a schedule %r on queue %r was made in the admin (or "
                "code); it is left alone and the declaration is not applied: rename one",
                label,
                row.name,
                row.queue,
            )
            continue
        if is_drifted(row):
            report.drifted.append(label)
            logger.warning(
                "schedule %r (queue %r) is declared in JOBQ['SCHEDULES'] but was edited since "
                "the last sync: the settings are written back",
                row.name,
                row.queue,
            )
        if row.settings_digest == wanted.settings_digest and label not in report.drifted:
            report.unchanged.append(label)
            continue
        for name in (*MANAGED_FIELDS, "settings_digest"):
            setattr(row, name, getattr(wanted, name))
        row.save(using=using)
        report.updated.append(label)
    keep = {(s.queue, s.name) for s in declared}
    for row in rows.filter(source=SETTINGS).order_by("pk"):
        if (row.queue, row.name) not in keep:
            deleted, _ = rows.filter(pk=row.pk).delete()
            if deleted:
                report.deleted.append(f"{row.queue}/{row.name}")
    if report.changed or report.drifted or report.conflicts:
        logger.info("schedules synced from settings: %s", report)
    return report
