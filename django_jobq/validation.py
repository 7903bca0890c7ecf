"""Edge validation: nothing that fails here ever reaches a storage key.

Job ids and queue names become parts of Redis keys, so the charset excludes everything that
could escape the key namespace or the hash tag (``{ } :``, glob characters, whitespace, control
characters) and anything with two Unicode spellings (only ASCII is allowed).
"""

from __future__ import annotations

import math
import re
from typing import TypeGuard

from .errors import InvalidJobId, InvalidOption, InvalidQueueName

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
