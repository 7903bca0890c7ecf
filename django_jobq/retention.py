"""Per-queue retention of finished jobs: the policy's shape, its validation, and applying the
one in settings (``JOBQ["QUEUES"][q]["retention"]``) to storage.

Retention is BullMQ's ``removeOnComplete`` / ``removeOnFail``: keep the newest N records of a
final state and/or none older than T. It is stored in the backend (like flow-control limits)
because the steps that finish jobs apply it, in whatever process runs them; workers and the
reaper write the settings' policy there when they start, so a deploy changes it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigurationError, InvalidOption
from .job import Keep, Retention
from .validation import validate_positive_ms

logger = logging.getLogger("django_jobq.retention")

STATES = ("completed", "failed", "cancelled")
MAX_COUNT = 1_000_000_000


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise InvalidOption(f"{where}: count must be an integer from 1 to {MAX_COUNT}, got "
                            f"{value!r}")  # fmt: skip
    return value


def _age(value: object, where: str) -> int:
    if isinstance(value, dt.timedelta):
        value = int(value.total_seconds() * 1000)
    try:
        return validate_positive_ms("age", value)
    except InvalidOption as exc:
        raise InvalidOption(f"{where}: {exc} (or a timedelta)") from exc


def parse_keep(value: object, where: str) -> Keep | None:
    """``{"count": n, "age": ms | timedelta}`` (either or both), a ``Keep``, or None."""
    if value is None or isinstance(value, Keep):
        if isinstance(value, Keep):
            return parse_keep({"count": value.count, "age": value.age}, where)
        return None
    if not isinstance(value, Mapping):
        raise InvalidOption(f"{where} must be a dict with 'count' and/or 'age', got {value!r}")
    unknown = set(value) - {"count", "age"}
    if unknown:
        raise InvalidOption(f"{where}: unknown key(s) {sorted(unknown)}; use 'count' and 'age'")
    count, age = value.get("count"), value.get("age")
    if count is None and age is None:
        raise InvalidOption(f"{where}: give 'count', 'age' or both (or leave the state out)")
    return Keep(
        None if count is None else _count(count, where),
        None if age is None else _age(age, where),
    )


def parse_retention(value: object, where: str = "retention") -> Retention:
    """A ``Retention`` from ``{"completed": {...}, "failed": {...}, "cancelled": {...}}``
    (states optional), a ``Retention`` (re-validated) or None (no policy). Raises
    ``InvalidOption`` with ``where`` in the message for anything else."""
    if value is None:
        return Retention()
    if isinstance(value, Retention):
        value = {s: k for s, k in value.items() if k is not None}
    if not isinstance(value, Mapping):
        raise InvalidOption(f"{where} must be a dict of states, got {value!r}")
    unknown = set(value) - set(STATES)
    if unknown:
        raise InvalidOption(
            f"{where}: unknown state(s) {sorted(map(str, unknown))}; use {', '.join(STATES)}"
        )
    return Retention(**{s: parse_keep(value.get(s), f"{where}[{s!r}]") for s in STATES})


def configured_retention(queue: str) -> Retention | None:
    """The policy ``JOBQ['QUEUES'][queue]['retention']`` sets (validated), or None when the
    settings say nothing for the queue (then storage keeps whatever was set last)."""
    from .conf import jobq_settings

    raw: Any = jobq_settings()["QUEUES"].get(queue, {}).get("retention")
    if raw is None:
        return None
    where = f"JOBQ['QUEUES'][{queue!r}]['retention']"
    try:
        return parse_retention(raw, where)
    except InvalidOption as exc:
        raise ConfigurationError(str(exc)) from exc


def apply_configured_retention(storage: Any, queues: Iterable[str]) -> None:
    """Write each queue's configured policy to storage (workers and the reaper at start). A
    storage blip is logged: the policy stored earlier still holds."""
    from .sharding import logical_name

    for name in queues:
        # A partition of a sharded queue keeps its logical queue's policy (a count is kept
        # per partition: docs/scaling.md).
        retention = configured_retention(logical_name(name))
        if retention is None:
            continue
        try:
            storage.set_retention(name, retention)
        except Exception as exc:  # storage blip: the policy stored earlier still holds
            logger.warning("could not apply the retention of queue %s: %s", name, exc)
