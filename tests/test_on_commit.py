"""``enqueue_on_commit`` on the Redis backend: the job exists only if the transaction commits."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_jobq.errors import InvalidOption
from django_jobq.queue import Queue
from django_jobq.states import JobState
from django_jobq.storage.redis.storage import RedisStorage

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def q(redis_client, redis_prefix) -> Queue:
    return Queue("oc", storage=RedisStorage(redis_client, prefix=redis_prefix))


def test_job_is_sent_only_when_the_transaction_commits(q):
    with transaction.atomic():
        job_id = q.enqueue_on_commit("later", {"n": 1})
        assert job_id == "later"
        assert q.get_status("later") is None  # nothing in Redis before the commit
    assert q.get_status("later").state is JobState.QUEUED


def test_job_is_dropped_when_the_transaction_rolls_back(q):
    with pytest.raises(RuntimeError), transaction.atomic():
        q.enqueue_on_commit("never", 1)
        raise RuntimeError("rollback")
    assert q.get_status("never") is None


def test_outside_a_transaction_it_enqueues_at_once_and_generates_an_id(q):
    job_id = q.enqueue_on_commit(payload=1)
    assert len(job_id) == 32
    assert q.get_status(job_id).state is JobState.QUEUED


def test_bad_input_fails_inside_the_transaction(q):
    with pytest.raises(InvalidOption), transaction.atomic():
        q.enqueue_on_commit("x", 1, retries=3)
