"""Edge validation: nothing that fails here ever reaches a storage key.

Job ids and queue names become parts of Redis keys, so the charset excludes everything that
could escape the key namespace or the hash tag (``{ } :``, glob characters, whitespace, control
characters) and anything with two Unicode spellings (only ASCII is allowed).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import TypeGuard

from .errors import InvalidJobId, InvalidOption, InvalidQueueName
from .job import Keep, Retention

JOB_ID_MAX_LENGTH = 128
QUEUE_NAME_MAX_LENGTH = 64
JOB_ID_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
QUEUE_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)
_QUEUE_RE = re.compile(QUEUE_NAME_PATTERN)
# Upper bound of any millisecond duration option: ten years. Bounds keep scores exact in doubles.
MAX_DURATION_MS = 10 * 365 * 24 * 3600 * 1000
# Priority * 2**42 + sequence must stay exact in a double (Redis scores, Lua numbers).
PRIORITY_RANGE = (-1000, 1000)


def validate_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise InvalidJobId(
            f"invalid job id {job_id!r}: 1-{JOB_ID_MAX_LENGTH} characters of A-Z a-z 0-9 _ . -"
            " , not starting with . or -"
        )
    return job_id


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name):
        raise InvalidQueueName(
            f"invalid queue name {name!r}: 1-{QUEUE_NAME_MAX_LENGTH} characters of"
            " A-Z a-z 0-9 _ . - , not starting with . or -"
        )
    return name


def validate_positive_ms(name: str, value: object, *, allow_zero: bool = False) -> int:
    """Durations are integer milliseconds; bools and floats are refused rather than guessed."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{name} must be an integer number of milliseconds, got {value!r}")
    low = 0 if allow_zero else 1
    if not low <= value <= MAX_DURATION_MS:
        raise InvalidOption(f"{name} must be between {low} and {MAX_DURATION_MS} ms, got {value}")
    return value


def is_seconds(value: object) -> TypeGuard[float]:
    """A finite real number (not a bool): what every option in seconds must be. NaN passes
    ``value > 0``-style range checks and infinity passes lower bounds, so both are tested
    here, once, instead of trusting each comparison."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate_seconds(name: str, value: object, *, maximum: float | None = None) -> float:
    """A positive, finite number of seconds (at most ``maximum`` when given)."""
    if not is_seconds(value) or value <= 0:
        raise InvalidOption(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidOption(f"{name} must be at most {maximum} seconds, got {value!r}")
    return float(value)


def validate_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOption(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > 1_000_000:
        raise InvalidOption(f"{name} must be at most 1000000, got {value}")
    return value


def validate_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"priority must be an integer, got {value!r}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise InvalidOption(f"priority must be between {low} and {high}, got {value}")
    return value


# -- partition names of sharded queues (``queue/sharding.py``, docs/scaling.md) ----------------
# A partition is an ordinary physical queue named ``<logical>~<i>of<n>``. ``~`` is refused in
# user queue names above, so no partition name can collide with a queue a user creates.

SEPARATOR = "~"
#: The most partitions one logical queue may have: past the masters of any cluster one would
#: run a queue on, and small enough for the name suffix (``~63of64``) to stay short.
MAX_SHARDS = 64
_SUFFIX_MAX = len(f"{SEPARATOR}{MAX_SHARDS - 1}of{MAX_SHARDS}")
_PARTITION_RE = re.compile(rf"({QUEUE_NAME_PATTERN}){SEPARATOR}(\d{{1,2}})of(\d{{1,2}})")


def validate_shards(value: object, where: str = "shards") -> int:
    """An int from 1 to ``MAX_SHARDS`` (bools and floats refused, not guessed)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
        raise InvalidOption(f"{where} must be an integer from 1 to {MAX_SHARDS}, got {value!r}")
    return value


def partition_name(logical: str, index: int, count: int) -> str:
    """The physical queue of partition ``index`` of ``count``."""
    return f"{logical}{SEPARATOR}{index}of{count}"


def partition_names(logical: str, count: int) -> list[str]:
    """The physical queues of a logical queue with ``count`` shards; one shard is the plain
    queue itself, so ``shards=1`` costs nothing and a queue sharded later keeps its jobs."""
    if count == 1:
        return [logical]
    return [partition_name(logical, i, count) for i in range(count)]


def parse_partition(name: str) -> tuple[str, int, int] | None:
    """``(logical, index, count)`` of a partition name, None for any other name."""
    match = _PARTITION_RE.fullmatch(name)
    if match is None:
        return None
    logical, index, count = match.group(1), int(match.group(2)), int(match.group(3))
    if not 0 <= index < count <= MAX_SHARDS or str(index) != match.group(2):
        return None
    if str(count) != match.group(3):
        return None
    return logical, index, count


def logical_name(name: str) -> str:
    """The logical queue a physical queue belongs to (itself when it is not a partition)."""
    if SEPARATOR not in name:  # the common case: one membership test
        return name
    parsed = parse_partition(name)
    return name if parsed is None else parsed[0]


def validate_physical_queue_name(name: object) -> str:
    """A user queue name or a partition name (what storage may be asked about)."""
    if isinstance(name, str) and SEPARATOR in name:
        if parse_partition(name) is None or len(name) > QUEUE_NAME_MAX_LENGTH:
            raise InvalidQueueName(
                f"invalid queue name {name!r}: {SEPARATOR!r} only appears in partition names"
                f" '<queue>{SEPARATOR}<i>of<n>'"
            )
        return name
    return validate_queue_name(name)


def validate_sharded_name(logical: str, count: int) -> None:
    """The partition names of ``logical`` must fit the 64 characters every backend stores."""
    if count > 1 and len(logical) + _SUFFIX_MAX > QUEUE_NAME_MAX_LENGTH:
        raise InvalidOption(
            f"queue {logical!r} cannot be sharded: its partition names need "
            f"{len(logical) + _SUFFIX_MAX} > {QUEUE_NAME_MAX_LENGTH} characters (use a name of"
            f" at most {QUEUE_NAME_MAX_LENGTH - _SUFFIX_MAX})"
        )


# -- retention policies of finished jobs (BullMQ's removeOnComplete / removeOnFail) ----------

RETENTION_STATES = ("completed", "failed", "cancelled")
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
    unknown = set(value) - set(RETENTION_STATES)
    if unknown:
        raise InvalidOption(
            f"{where}: unknown state(s) {sorted(map(str, unknown))}; use "
            f"{', '.join(RETENTION_STATES)}"
        )
    return Retention(**{s: parse_keep(value.get(s), f"{where}[{s!r}]") for s in RETENTION_STATES})
