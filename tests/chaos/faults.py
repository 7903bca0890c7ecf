"""Crash injection at the two points a worker can die between storage steps (fault test 2).

``crashing_storage`` is a ``JOBQ['BACKEND']`` dotted path: the real Redis storage, whose
``claim`` and ``ack_many`` end the process with ``os._exit`` (no cleanup, as a SIGKILL or a
power cut would) when they carry the first attempt of a job marked by its id (the first claim
or verdict of that id: a Redis marker set once per id, since tokens are not counters):

- ``claimcrash-*``: right after the claim reached Redis, before any handler ran;
- ``ackcrash-*``: right after the handler's effect, before its ``complete`` is sent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from django_jobq.conf import jobq_settings
from django_jobq.job import AckOutcome
from django_jobq.storage.base import Ack, ClaimBatch
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

CRASH_CODE = 86  # the exit status of an injected crash, told apart from real failures


class CrashingRedisStorage(RedisStorage):
    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        batch = super().claim(queue, worker_id, count, lease_ms)
        if any(self._first(j.job_id, "claimcrash-") for j in batch.jobs):
            os._exit(CRASH_CODE)
        return batch

    def ack_many(self, queue: str, acks: Sequence[Ack]) -> list[AckOutcome]:
        if any(self._first(a.job_id, "ackcrash-") for a in acks):
            os._exit(CRASH_CODE)
        return super().ack_many(queue, acks)

    def _first(self, job_id: str, mark: str) -> bool:
        """True once per marked id: the crash happens on its first claim (or verdict) only."""
        if not job_id.startswith(mark):
            return False
        return bool(self.client.set(f"{self.prefix}-crashed:{job_id}", 1, nx=True, ex=86400))


def crashing_storage() -> CrashingRedisStorage:
    conf = jobq_settings()
    return CrashingRedisStorage(client_from_url(conf["REDIS_URL"]), prefix=conf["PREFIX"])
