"""Sharded queues: one logical queue stored as N partitions (docs/scaling.md). Partition names
are plumbing (``validation.py``: every layer down to the Redis keys reads them); routing and
the shares of limits are here.

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

import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..conf import configured_shards
from ..errors import InvalidOption
from ..validation import logical_name, partition_names

if TYPE_CHECKING:
    from ..job import NewJob, QueueLimits


def route(key: str, count: int) -> int:
    """The partition index of ``key``: CRC-32, the same in every process and every release
    (Python's ``hash()`` of a str is salted per process)."""
    return zlib.crc32(key.encode()) % count if count > 1 else 0


def routing_key(job: NewJob) -> str:
    """Dedup key, else group, else id: what must be seen by one atomic step."""
    if job.dedup is not None:
        return job.dedup.key
    return job.group if job.group is not None else job.job_id


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
