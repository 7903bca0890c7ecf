"""What the storage loses behind the library's back, done to each backend the way it happens.

Redis restarting without its data (or failing over to a replica that had not caught up) loses
every key; a record past its ``result_ttl`` is dropped by Redis's own clock, not by the fake
clock the tests drive. These helpers do exactly that to the backend under test, without going
through the storage API, so that the model test can check what the library does next.
"""

from __future__ import annotations

from collections.abc import Iterable

from django_jobq.storage.base import Storage
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.memory import MemoryStorage
from django_jobq.storage.redis.storage import RedisStorage


def lose_queue(storage: Storage, queue: str) -> None:
    """Every record, index, counter and key of ``queue`` disappears at once."""
    if isinstance(storage, RedisStorage):
        keys = list(storage.client.scan_iter(match=storage.keys(queue).everything, count=1000))
        if keys:
            storage.client.delete(*keys)
    elif isinstance(storage, MemoryStorage):
        with storage._cond:
            storage._queues.pop(queue, None)
    elif isinstance(storage, DatabaseStorage):
        # A database does not lose rows on its own; the nearest event is a restore that
        # predates the queue, which leaves what obliterate leaves.
        storage.obliterate(queue, force=True)
    else:  # pragma: no cover - a new backend must say how it loses data
        raise TypeError(f"no data-loss recipe for {type(storage).__name__}")


def expire_records(storage: Storage, queue: str, job_ids: Iterable[str]) -> None:
    """Drop the records whose ``result_ttl`` passed by the fake clock. Only Redis needs this:
    it expires records with PEXPIRE on its own clock, while the memory and database backends
    compare expiry times with the injected clock themselves."""
    if isinstance(storage, RedisStorage):
        keys = [storage.keys(queue).job(job_id) for job_id in job_ids]
        if keys:
            storage.client.delete(*keys)
