"""Sharded queues: one logical queue stored as N partitions (docs/scaling.md).

A partition is an ordinary physical queue whose name is derived from the logical one,
``<logical>~<i>of<n>``. ``~`` is refused in user queue names (``validation.py``), so no
partition name can ever collide with a queue a user creates, and every backend, every Lua
script and every key layout stays as it is: on Redis each partition carries its own hash tag
(``{prefix:orders~0of3}``), so the partitions of one queue can live on different masters
(``keys.py`` pins them to evenly spaced slots).

The count is part of the name so that raising it never re-uses a partition: a queue moved from
3 to 6 shards leaves ``orders~*of3`` to drain while new jobs go to ``orders~*of6``; workers
serve registered old partitions until they are empty (``served_queues``).

Routing is a stable hash (CRC-32, not Python's salted ``hash()``) of the job's routing key:
its dedup key, else its rate-limit group, else its id. So a dedup key, a group's budget and
every per-id operation live in one partition, where they stay atomic.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .errors import ConfigurationError, InvalidOption, InvalidQueueName
from .validation import QUEUE_NAME_MAX_LENGTH, QUEUE_NAME_PATTERN, validate_queue_name

if TYPE_CHECKING:
    from .job import NewJob, QueueLimits

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


def is_partition(name: str) -> bool:
    return SEPARATOR in name and parse_partition(name) is not None


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


def route(key: str, count: int) -> int:
    """The partition index of ``key``: CRC-32, the same in every process and every release
    (Python's ``hash()`` of a str is salted per process)."""
    return zlib.crc32(key.encode()) % count if count > 1 else 0


def routing_key(job: NewJob) -> str:
    """Dedup key, else group, else id: what must be seen by one atomic step."""
    if job.dedup is not None:
        return job.dedup.key
    return job.group if job.group is not None else job.job_id


def configured_shards(logical: str) -> int:
    """``JOBQ["QUEUES"][logical]["shards"]`` (1 when unset); validated."""
    from .conf import jobq_settings

    value = jobq_settings()["QUEUES"].get(logical, {}).get("shards", 1)
    where = f"JOBQ['QUEUES'][{logical!r}]['shards']"
    try:
        count = validate_shards(value, where)
        validate_sharded_name(logical, count)
    except InvalidOption as exc:
        raise ConfigurationError(str(exc)) from None
    return count


def members(logical: str, known: Iterable[str]) -> list[str]:
    """The physical queues among ``known`` that belong to ``logical``: the plain queue and
    every partition of any count (old partitions left by a change of shards included)."""
    return sorted(n for n in known if n == logical or logical_name(n) == logical)


def collapse(names: Iterable[str]) -> list[str]:
    """Queue names as users know them: partitions replaced by their logical queue."""
    return sorted({logical_name(n) for n in names})


def served_queues(
    logicals: Sequence[str], known: Iterable[str], waiting: dict[str, bool] | None = None
) -> list[str]:
    """The physical queues a worker of ``logicals`` serves: each queue's current partitions,
    plus the registered members left by an earlier shard count (the plain queue, or
    ``*of<m>``) while ``waiting`` says they still hold jobs (unknown: served)."""
    out: list[str] = []
    known = list(known)
    for logical in logicals:
        current = partition_names(logical, configured_shards(logical))
        out.extend(n for n in current if n not in out)
        for name in members(logical, known):
            if name not in out and (waiting is None or waiting.get(name, True)):
                out.append(name)
    return out


def split_limits(limits: QueueLimits, count: int) -> QueueLimits:
    """Each partition's share of queue-wide limits. ``rate_max`` and ``concurrency`` are
    enforced by each partition's own atomic step, so each gets ``value // count`` and the
    total never exceeds the value asked (a skewed load may use less of it). Group limits are
    whole: a group routes to one partition."""
    from dataclasses import replace

    shares = {}
    for name in ("rate_max", "concurrency"):
        value = getattr(limits, name)
        if value is not None and count > 1:
            if value < count:
                raise InvalidOption(
                    f"{name} {value} is below the queue's {count} shards: each partition"
                    " enforces its own share, which must be at least 1"
                )
            shares[name] = value // count
    return replace(limits, **shares) if shares else limits
