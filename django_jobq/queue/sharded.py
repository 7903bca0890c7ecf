"""``ShardedQueue``: the Queue API over the partitions of one logical queue (sharding.py).

Writes go to one partition, chosen by ``sharding.route``; per-id operations go first to the
partition the id routes to, then (when it does not know the id) to the others, so jobs routed
by their dedup key or group, and jobs left in partitions of an earlier shard count, are still
found. Queue-wide reads and controls visit every member: the current partitions and any
registered old ones (the plain queue before sharding, ``*of<m>`` after a change of count).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from asgiref.sync import sync_to_async

from ..errors import InvalidOption
from ..job import (
    CancelOutcome,
    ChangeOutcome,
    DeadLetter,
    JobResult,
    JobStatus,
    NewJob,
    PendingFailureCall,
    QueueLimits,
    Retention,
    RetryOutcome,
    StoredEnqueue,
)
from ..states import JobState
from ..validation import (
    parse_retention,
    partition_names,
    validate_job_id,
    validate_positive_int,
)
from . import sharded_events
from .core import Queue, _shard_count, checked_limits
from .events import PageReader
from .sharding import members, route, routing_key, split_limits


class ShardedQueue(Queue, sharded=True):
    """One logical queue stored as ``shards`` partitions; the API of ``Queue``.

    Order (priority, FIFO, LIFO) holds within a partition, not across them: workers take
    from the partitions in turn. Queue-wide ``rate_max`` and ``concurrency`` are split
    evenly over the partitions (``sharding.split_limits``). ``events`` merges every
    partition's feed (ordered per partition, merged by time; see sharded_events.py).
    """

    def __init__(self, name: str = "default", *, shards: int | None = None, **kwargs: Any):
        super().__init__(name, **kwargs)
        self.shards = _shard_count(self.name, shards)
        self.partition_names = partition_names(self.name, self.shards)
        self._parts: dict[str, Queue] = {}
        self.partitions = [self.partition(n) for n in self.partition_names]

    def __repr__(self) -> str:
        return f"<ShardedQueue {self.name!r} x{self.shards} on {type(self.storage).__name__}>"

    def partition(self, which: int | str) -> Queue:
        """Partition ``which`` (an index, or any member's physical name) as a plain Queue."""
        name = self.partition_names[which] if isinstance(which, int) else which
        queue = self._parts.get(name)
        if queue is None:
            queue = self._parts[name] = Queue(
                name, storage=self.storage, serde=self.serde, defaults=self.defaults,
                max_payload_bytes=self.max_payload_bytes, durability=self.durability,
                shards=1,  # the plain queue of a sharded name is one physical queue too
            )  # fmt: skip
        return queue

    def members(self) -> list[Queue]:
        """Current partitions, then registered members of earlier shard counts (one read of
        the queue registry)."""
        names = list(self.partition_names)
        names += [n for n in members(self.name, self.storage.list_queues()) if n not in names]
        return [self.partition(n) for n in names]

    # -- routing ----------------------------------------------------------------------------

    def _home(self, job: NewJob) -> Queue:
        return self.partitions[route(routing_key(job), self.shards)]

    def partition_for(self, key: str) -> str:
        return self.partition_names[route(key, self.shards)]

    def _for_id(self, job_id: str) -> Queue:
        return self.partitions[route(job_id, self.shards)]

    def _store_many(self, built: list[NewJob]) -> list[StoredEnqueue]:
        """One ``enqueue_many`` per partition; answers put back in the callers' order."""
        groups: dict[int, list[int]] = defaultdict(list)
        for i, job in enumerate(built):
            groups[route(routing_key(job), self.shards)].append(i)
        out: list[StoredEnqueue | None] = [None] * len(built)
        for index, positions in groups.items():
            stored = self.partitions[index]._store_many([built[i] for i in positions])
            for position, answer in zip(positions, stored, strict=True):
                out[position] = answer
        return out  # type: ignore[return-value]  # every position was filled

    def _by_id[T](self, job_id: str, act: Callable[[Queue], T], missing: Callable[[T], bool]) -> T:
        """``act`` on the partition ``job_id`` routes to; when it does not know the id, on
        the other members in turn until one does (else the first answer)."""
        first = self._for_id(validate_job_id(job_id))
        answer = act(first)
        if not missing(answer):
            return answer
        for other in self.members():
            if other is not first:
                found = act(other)
                if not missing(found):
                    return found
        return answer

    def locate(self, job_id: str) -> Queue:
        return self._by_id(job_id, lambda q: (q, q.get_status(job_id)), lambda a: a[1] is None)[0]

    def _status_here(self, status: JobStatus | None) -> JobStatus | None:
        return None if status is None else replace(status, queue=self.name)

    # -- per id -----------------------------------------------------------------------------

    def get_status(self, job_id: str) -> JobStatus | None:
        found = self._by_id(job_id, lambda q: q.get_status(job_id), _is_none)
        return self._status_here(found)

    def get_payload(self, job_id: str) -> Any:
        status = self._by_id(job_id, lambda q: (q.get_status(job_id), q), lambda a: a[0] is None)
        return None if status[0] is None else status[1].get_payload(job_id)

    def get_result(self, job_id: str) -> JobResult | None:
        return self._by_id(job_id, lambda q: q.get_result(job_id), _is_none)

    # The look-up may visit several partitions: one thread hop for all of them, on the thread
    # sync views share (as the plain queue's non-native path), not a native call per partition.
    async def aget_status(self, job_id: str) -> JobStatus | None:
        return await sync_to_async(self.get_status)(job_id)

    async def aget_result(self, job_id: str) -> JobResult | None:
        return await sync_to_async(self.get_result)(job_id)

    def cancel(self, job_id: str, *, force: bool = False) -> CancelOutcome:
        return self._by_id(
            job_id, lambda q: q.cancel(job_id, force=force), lambda o: o is CancelOutcome.NOT_FOUND
        )

    def change_run_at(
        self,
        job_id: str,
        run_at: dt.datetime | None = None,
        *,
        delay: int | dt.timedelta | None = None,
    ) -> ChangeOutcome:
        return self._by_id(
            job_id, lambda q: q.change_run_at(job_id, run_at, delay=delay), _change_missing
        )

    def change_priority(self, job_id: str, priority: int) -> ChangeOutcome:
        return self._by_id(job_id, lambda q: q.change_priority(job_id, priority), _change_missing)

    def promote(self, job_id: str) -> ChangeOutcome:
        return self._by_id(job_id, lambda q: q.promote(job_id), _change_missing)

    def retry(self, job_id: str) -> RetryOutcome:
        return self._by_id(job_id, lambda q: q.retry(job_id), lambda o: o is RetryOutcome.NOT_FOUND)

    def retry_many(self, job_ids: Iterable[str]) -> dict[str, RetryOutcome]:
        ids = [validate_job_id(job_id) for job_id in job_ids]
        return {job_id: self.retry(job_id) for job_id in ids}

    def delete(self, job_ids: Iterable[str]) -> int:
        ids = [validate_job_id(job_id) for job_id in job_ids]
        return sum(q.delete(ids) for q in self.members()) if ids else 0

    # -- the whole queue --------------------------------------------------------------------

    def counts(self) -> dict[JobState, int]:
        total: dict[JobState, int] = defaultdict(int)
        for queue in self.members():
            for state, n in queue.counts().items():
                total[state] += n
        return dict(total)

    def pause(self) -> None:
        for queue in self.members():
            queue.pause()

    def resume(self) -> None:
        for queue in self.members():
            queue.resume()

    def is_paused(self) -> bool:
        """Paused when every current partition is (a pause half done by a failure is shown
        as not paused, so the operator pauses again)."""
        return all(q.is_paused() for q in self.partitions)

    def set_limits(self, **limits: Any) -> QueueLimits:
        """``Queue.set_limits`` for the logical queue: each member gets its share
        (``sharding.split_limits``); returns the limits as asked."""
        asked = checked_limits(**limits)
        share = split_limits(asked, self.shards)
        for queue in self.members():
            queue._register()
            queue.storage.set_limits(queue.name, share)
        return asked

    def get_limits(self) -> QueueLimits:
        """The limits in force over the logical queue: shares of the current partitions
        summed (group limits are per group, as set)."""
        each = [q.get_limits() for q in self.partitions]
        summed = {
            name: sum(getattr(limits, name) for limits in each)
            for name in ("rate_max", "concurrency")
            if all(getattr(limits, name) is not None for limits in each)
        }
        return replace(each[0], **summed)

    def set_retention(self, retention: Any = None, **states: Any) -> Retention:
        """``Queue.set_retention`` for the logical queue: every member keeps the policy, as
        workers apply a configured one (a count is kept per partition: docs/scaling.md).
        The plain ``Queue`` method set it on the logical name, which no worker serves."""
        if retention is not None and states:
            raise InvalidOption("give a Retention (or dict) or per-state keywords, not both")
        policy = parse_retention(states if retention is None else retention)
        for queue in self.members():
            queue.set_retention(policy)
        return policy

    def get_retention(self) -> Retention:
        return self.partitions[0].get_retention()

    def drain(self, *, delayed: bool = True) -> int:
        return sum(q.drain(delayed=delayed) for q in self.members())

    def clean(self, older_than: int | dt.timedelta, **kwargs: Any) -> int:
        return sum(q.clean(older_than, **kwargs) for q in self.members())

    def obliterate(self, *, force: bool = False) -> int:
        removed = sum(q.obliterate(force=force) for q in self.members())
        self._registered = False
        return removed

    def dead_letters(self, *, offset: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Newest failure first across the members (each asked for ``offset + limit``)."""
        offset = validate_positive_int("offset", offset, minimum=0)
        limit = validate_positive_int("limit", limit)
        merged = [d for q in self.members() for d in q.dead_letters(limit=offset + limit)]
        merged.sort(key=lambda d: d.status.finished_at or _EPOCH, reverse=True)
        return [
            DeadLetter(replace(d.status, queue=self.name), d.payload)
            for d in merged[offset : offset + limit]
        ]

    def count_dead(self) -> int:
        return sum(q.count_dead() for q in self.members())

    def retry_dead(self, job_ids: Iterable[str] | None = None, *, limit: int = 10_000) -> int:
        if job_ids is None:
            limit = validate_positive_int("limit", limit)
            job_ids = [d.status.job_id for d in self.dead_letters(limit=limit)]
        outcomes = self.retry_many(job_ids)
        return sum(1 for o in outcomes.values() if o is RetryOutcome.RETRIED)

    def purge_dead(self, job_ids: Iterable[str] | None = None) -> int:
        ids = None if job_ids is None else [validate_job_id(j) for j in job_ids]
        return sum(q.purge_dead(ids) for q in self.members())

    def failure_calls(self, *, offset: int = 0, limit: int = 100) -> list[PendingFailureCall]:
        offset = validate_positive_int("offset", offset, minimum=0)
        limit = validate_positive_int("limit", limit)
        merged = [c for q in self.members() for c in q.failure_calls(limit=offset + limit)]
        merged.sort(key=lambda c: c.due_at)
        return merged[offset : offset + limit]

    def count_failure_calls(self) -> int:
        return sum(q.count_failure_calls() for q in self.members())

    def _feed(
        self, since: str, kinds: Iterable[str] | None, follow: bool, wait: float, batch: int
    ) -> tuple[PageReader, str, frozenset[str] | None, dict[str, Any]]:
        """Every current partition's events as one feed, ordered per partition and merged by
        time (``at``, then partition). Each event's ``id`` is a composite cursor (every
        partition's position after it, ``s<N>:<id0>,...``): pass the last one handled as
        ``since`` to resume with exactly the rest. ``queue`` on each event is the logical
        name. With ``follow``, one wait covers every partition. See sharded_events.py."""
        _, _, chosen, options = super()._feed("0", kinds, follow, wait, batch)
        sharded_events.parse_cursor(since, self.shards)
        feed = sharded_events.MergedEvents(self.storage, self.name, self.partition_names)
        return feed.read, since, chosen, options


_EPOCH = dt.datetime.fromtimestamp(0, tz=dt.UTC)


def _is_none(value: object) -> bool:
    return value is None


def _change_missing(outcome: ChangeOutcome) -> bool:
    return outcome is ChangeOutcome.NOT_FOUND
