"""Queue factories for ``enqueue_dataframe`` tests: module-level (so Spark pickles them by
reference) and bound to the test's own Redis key prefix with functools.partial."""

from __future__ import annotations

from django_jobq.queue import Queue
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage


def redis_queue(url: str, prefix: str, name: str) -> Queue:
    return Queue(name, storage=RedisStorage(client_from_url(url), prefix=prefix))
