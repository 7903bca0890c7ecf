"""Fault 12: Redis at ``maxmemory`` with ``noeviction``: enqueue fails with a clear error (API
503) and nothing is half-written."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from django_jobq.api.keys import create_key
from django_jobq.backend import reset_storage
from django_jobq.errors import StorageFull
from django_jobq.storage.redis.keys import QueueKeys

from ..private_redis import keep_full
from .conftest import events_of

BLOB = "x" * 50_000


def consistency(queue) -> tuple[set[str], set[str], set[str]]:
    """(ids with a record, ids in the queued index, ids with a 'queued' event)."""
    storage = queue.storage
    keys = QueueKeys.for_queue(storage.prefix, queue.name)
    records = {
        k.decode()[len(keys.job_prefix) :]
        for k in storage.client.scan_iter(match=keys.everything[:-1] + "job:*", count=1000)
    }
    indexed = {m.decode() for m in storage.client.zrange(keys.queued, 0, -1)}
    events = {e.job_id for e in events_of(queue, "queued")}
    return records, indexed, events


@pytest.mark.django_db(transaction=True)
def test_enqueue_at_maxmemory_fails_cleanly_and_writes_nothing(
    private_redis, queue_of, prefix, settings, report
):
    server = private_redis("--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
    queue = queue_of("chaos-full", server.url)
    stored, error = [], None
    for i in range(1000):
        try:
            queue.enqueue(f"fill-{i}", {"blob": BLOB})
        except Exception as exc:  # the error is what the test inspects
            error = exc
            break
        stored.append(f"fill-{i}")
    assert isinstance(error, StorageFull), error
    assert "maxmemory" in str(error), error  # says what is wrong
    try:  # a bulk call refused part-way through
        queue.enqueue_many([{"id": f"bulk-{i}", "payload": {"blob": BLOB}} for i in range(300)])
    except Exception as exc:
        bulk_error: Exception | None = exc
    else:
        bulk_error = None
    keep_full(server.client)  # for the API's calls below

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": server.url,
                     "PREFIX": prefix}  # fmt: skip
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Api-Key " + create_key(
        "chaos", queues=["*"], actions=["enqueue", "read"])[1])  # fmt: skip
    single = api.post("/jobq/queues/chaos-full/jobs/", {"id": "api-1", "payload": {"blob": BLOB}},
                      format="json")  # fmt: skip
    bulk = api.post("/jobq/queues/chaos-full/bulk/",
                    {"jobs": [{"id": f"api-bulk-{i}", "payload": {"blob": BLOB}}
                              for i in range(5)]}, format="json")  # fmt: skip

    records, indexed, events = consistency(queue)
    report(
        fault="12. Redis at maxmemory, noeviction",
        load=f"{len(stored)} jobs of 50 kB filled 8 MB; then single, bulk and API enqueues",
        lost=0, duplicated=0,
        recovery=f"{type(error).__name__}; API {single.status_code}/{bulk.status_code}; "
        f"{len(records)} records, all whole",
    )  # fmt: skip
    assert isinstance(bulk_error, StorageFull) and "maxmemory" in str(bulk_error)
    assert (single.status_code, bulk.status_code) == (503, 503)
    assert "full" in single.json()["detail"]
    assert set(stored) <= records
    assert records == indexed == events  # every job whole: record, place in line, event
    assert not {"api-1", f"fill-{len(stored)}"} & records
    bulk_ids = {r for r in records if r.startswith("bulk-")}
    assert bulk_ids == {f"bulk-{i}" for i in range(len(bulk_ids))}  # a prefix of whole chunks

    server.client.config_set("maxmemory", "0")  # room again: enqueues go through
    assert queue.enqueue("after", {"blob": BLOB}).created
    assert api.post("/jobq/queues/chaos-full/jobs/", {"id": "api-2"},
                    format="json").status_code == 201  # fmt: skip
    reset_storage()
