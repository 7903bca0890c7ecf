"""The REST API's 503 answers come from the storage's ``StorageUnavailable`` and
``StorageFull``: a full Redis (a private server with a tiny ``maxmemory``) is ``storage_full``."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_jobq.backend import reset_storage

from ..private_redis import PrivateRedis
from ..test_storage_unavailable import Q, fill, queue_on


@pytest.fixture
def full_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path / "full", "--maxmemory", "3mb", "--maxmemory-policy",
                          "noeviction")  # fmt: skip
    yield server
    server.stop()


@pytest.fixture
def api_on_full_redis(full_redis, settings, client_for):
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": full_redis.url,
                     "PREFIX": "outage-api"}  # fmt: skip
    reset_storage()
    yield client_for()
    reset_storage()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_the_api_answers_503_storage_full_when_redis_is_full(api_on_full_redis, full_redis):
    fill(queue_on(full_redis.url))
    response = api_on_full_redis.post(
        f"/jobq/queues/{Q}/jobs/", {"id": "api-1", "payload": {"blob": "z" * 50_000}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert "full" in response.json()["detail"]
