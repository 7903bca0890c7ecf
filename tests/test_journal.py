"""durability="journal": the journal row is written with the producer's transaction, the job
reaches Redis on commit, and jobq_reconcile re-creates what Redis lost (never what it still
knows, never what finished). Real Redis, real SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings

from django_jobq.backend import check_settings
from django_jobq.errors import ConfigurationError, InvalidOption, QueueBusy, Timeout
from django_jobq.job import (
    Dedup,
    DedupMode,
    EnqueueOutcome,
    JobOptions,
    JobUpdate,
    NewJob,
    RunAtUpdate,
)
from django_jobq.models import JournalEntry
from django_jobq.queue import Queue
from django_jobq.queue.journal import decode_job, encode_options, reconcile
from django_jobq.states import JobState
from django_jobq.storage.memory import MemoryStorage
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.worker.reaper import Reaper

pytestmark = [pytest.mark.redis]

QUEUE = "journaled"


@pytest.fixture(
    params=["default", pytest.param("pg", marks=pytest.mark.postgres)], ids=["sqlite", "postgres"]
)
def db_alias(request) -> str:
    """Named so that tests/conftest.py gives the test that database, in transactional mode."""
    return request.param


@pytest.fixture
def alias(db_alias) -> str:
    return db_alias


@pytest.fixture
def jobq(alias, redis_prefix, settings):
    """JOBQ with this test's Redis prefix and the journal (and mirror) on ``alias``."""
    settings.JOBQ = {
        **settings.JOBQ,
        "BACKEND": "redis",
        "PREFIX": redis_prefix,
        "JOURNAL": {"DATABASE_ALIAS": alias, "MIN_AGE": 0},
        "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": alias},
    }
    return settings.JOBQ


@pytest.fixture
def storage(jobq, redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def q(storage) -> Queue:
    return Queue(QUEUE, storage=storage, durability="journal")


def entries(alias: str) -> dict[str, JournalEntry]:
    return {e.job_id: e for e in JournalEntry.objects.using(alias).filter(queue=QUEUE)}


def lose_queue(redis_client, redis_prefix: str, queue: str = QUEUE) -> None:
    """What a restart from an older AOF or a failover does to a queue: its keys are gone."""
    keys = list(redis_client.scan_iter(match="{" + f"{redis_prefix}:{queue}" + "}*"))
    assert keys
    redis_client.delete(*keys)


def finish(storage: RedisStorage, job_id: str) -> None:
    batch = storage.claim(QUEUE, "w1", 10, 30_000)
    job = next(j for j in batch.jobs if j.job_id == job_id)
    storage.complete(QUEUE, job.job_id, job.token, b"1")


# -- the write path ---------------------------------------------------------------------------


def test_in_a_transaction_the_job_is_journaled_at_once_and_sent_on_commit(q, alias):
    with transaction.atomic(using=alias):
        result = q.enqueue("a", {"n": 1})
        assert (result.outcome, result.state) == (EnqueueOutcome.PENDING, JobState.QUEUED)
        assert q.get_status("a") is None  # nothing in Redis before the commit
        assert set(entries(alias)) == {"a"}  # but the entry is part of the transaction
    assert q.get_status("a").state is JobState.QUEUED
    assert set(entries(alias)) == {"a"}  # kept until the job finishes


def test_a_rollback_leaves_nothing_in_redis_and_no_entry(q, alias):
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        q.enqueue("never", 1)
        q.enqueue_many([("never-2", 2)])
        raise RuntimeError("rollback")
    assert q.get_status("never") is None
    assert q.get_status("never-2") is None
    assert entries(alias) == {}


def test_enqueue_on_commit_journals_inside_the_transaction(q, alias):
    with transaction.atomic(using=alias):
        assert q.enqueue_on_commit("oc", 1) == "oc"
        assert set(entries(alias)) == {"oc"}
        assert q.get_status("oc") is None
    assert q.get_status("oc").state is JobState.QUEUED


def test_enqueue_on_commit_refuses_another_database_than_the_journals(q, alias):
    other = "pg" if alias == "default" else "default"
    with pytest.raises(InvalidOption, match="JOURNAL"):
        q.enqueue_on_commit("elsewhere", 1, using=other)
    assert entries(alias) == {}


def test_outside_a_transaction_the_entry_is_committed_then_the_job_sent(q, alias):
    result = q.enqueue("now", {"n": 1}, priority=3)
    assert result.outcome is EnqueueOutcome.QUEUED
    assert q.get_status("now").priority == 3
    entry = entries(alias)["now"]
    assert bytes(entry.payload) == b'{"n":1}'
    assert entry.options["o"][5] == 3


def test_enqueue_many_journals_every_job_in_bulk(q, alias):
    results = q.enqueue_many([(f"m{i}", i) for i in range(1200)])
    assert {r.outcome for r in results} == {EnqueueOutcome.QUEUED}
    assert len(entries(alias)) == 1200
    assert q.counts()[JobState.QUEUED] == 1200


def test_an_id_answered_as_finished_or_by_a_dedup_holder_leaves_no_entry(q, storage, alias):
    q.enqueue("holder", 1, dedup_key="k")
    other = q.enqueue("other", 2, dedup_key="k")
    assert (other.outcome, other.job_id) == (EnqueueOutcome.DUPLICATE, "holder")
    q.enqueue("done", 3)
    finish(storage, "done")
    again = q.enqueue("done", 3)
    assert again.outcome is EnqueueOutcome.COMPLETED
    assert set(entries(alias)) == {"holder"}


def test_redis_unreachable_gives_pending_and_reconcile_sends_the_job(storage, alias):
    dead = RedisStorage(
        client_from_url("redis://127.0.0.1:7299/0", socket_connect_timeout=0.2),
        prefix=storage.prefix,
    )
    result = Queue(QUEUE, storage=dead, durability="journal").enqueue("kept", {"n": 1})
    assert result.outcome is EnqueueOutcome.PENDING  # accepted: it is in the journal
    assert set(entries(alias)) == {"kept"}

    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert report.recreated == 1
    assert Queue(QUEUE, storage=storage).get_status("kept").state is JobState.QUEUED


def test_enqueue_and_wait_journals_and_sends_before_waiting(q, alias):
    with pytest.raises(Timeout):
        q.enqueue_and_wait("waited", 1, timeout=0.2)  # no worker: it times out, but ...
    assert set(entries(alias)) == {"waited"}  # ... it was journaled
    assert q.get_status("waited").state is JobState.QUEUED  # and sent before the wait


def test_enqueue_and_wait_refuses_to_wait_inside_a_transaction(q, alias):
    with pytest.raises(InvalidOption, match="inside a transaction"), transaction.atomic(alias):
        q.enqueue_and_wait("w", 1, timeout=1)
    assert entries(alias) == {}


def test_every_enqueue_option_survives_the_journal_encoding():
    job = NewJob(
        "j", b"\x81\xa1n\x01", JobOptions(7, 60_000, 5, 50, 2, -3), run_at=1_900_000_000_000,
        content_type="msgpack", lifo=True, group="g", singleton=True,
        update=JobUpdate(True, RunAtUpdate.IF_LATER, True, False, True),
        dedup=Dedup("k", DedupMode.DEBOUNCE, 1500),
    )  # fmt: skip
    data = json.loads(json.dumps(encode_options(job, now=0)))  # what the JSON column keeps
    assert decode_job("j", job.payload, "msgpack", data) == job


def test_a_delay_is_encoded_as_an_absolute_due_time():
    job = NewJob("d", b"1", JobOptions(), run_at=None, delay=500)
    decoded = decode_job("d", b"1", "json", encode_options(job, now=1_000))
    assert (decoded.run_at, decoded.delay) == (1_500, 0)


# -- reconcile --------------------------------------------------------------------------------


def test_reconcile_recreates_lost_jobs_with_their_id_and_options(q, redis_client, storage, alias):
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    q.enqueue("plain", {"n": 1})
    q.enqueue("tuned", {"n": 2}, priority=-5, max_attempts=7, result_ttl=60_000, group="g1")
    q.enqueue("later", {"n": 3}, run_at=run_at)
    q.enqueue("keyed", {"n": 4}, dedup_key="dk")
    lose_queue(redis_client, storage.prefix)
    assert q.get_status("plain") is None

    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]

    assert (report.checked, report.recreated, report.live) == (4, 4, 0)
    tuned = q.get_status("tuned")
    assert (tuned.state, tuned.priority, tuned.max_attempts, tuned.group) == (
        JobState.QUEUED, -5, 7, "g1",
    )  # fmt: skip
    assert storage.get_record(QUEUE, "tuned").result_ttl == 60_000
    later = q.get_status("later")
    assert later.state is JobState.SCHEDULED
    assert abs((later.run_at - run_at).total_seconds()) < 0.01
    assert storage.get_record(QUEUE, "plain").payload == b'{"n":1}'
    assert q.enqueue("dup", 5, dedup_key="dk").job_id == "keyed"  # the dedup key is back


def test_per_job_timeouts_travel_with_the_journaled_payload(q, redis_client, storage, alias):
    q.enqueue("timed", {"n": 1}, timeout=5, hard_timeout=9)
    before = storage.get_record(QUEUE, "timed")
    lose_queue(redis_client, storage.prefix)
    reconcile(storage, [QUEUE], min_age=0)
    after = storage.get_record(QUEUE, "timed")
    assert (after.payload, after.content_type) == (before.payload, before.content_type)


def test_a_delay_is_journaled_as_the_original_due_time(q, redis_client, storage, alias):
    before = dt.datetime.now(dt.UTC)
    q.enqueue("delayed", 1, delay=dt.timedelta(minutes=10))
    lose_queue(redis_client, storage.prefix)
    reconcile(storage, [QUEUE], min_age=0)
    status = q.get_status("delayed")
    assert status.state is JobState.SCHEDULED
    due = before + dt.timedelta(minutes=10)
    assert dt.timedelta(milliseconds=-1) <= status.run_at - due < dt.timedelta(seconds=5)


def test_reconcile_never_duplicates_a_job_redis_still_knows(q, storage, alias):
    q.enqueue("live", 1)
    storage.claim(QUEUE, "w1", 1, 30_000)  # running now: attempts 1
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.live, report.recreated) == (1, 0)
    status = q.get_status("live")
    assert (status.state, status.attempts) == (JobState.ACTIVE, 1)
    assert q.counts()[JobState.QUEUED] == 0
    assert set(entries(alias)) == {"live"}


def test_reconcile_deletes_entries_of_finished_jobs_and_skips_them(q, storage, redis_client, alias):
    q.enqueue("done", 1)
    q.enqueue("open", 2)
    finish(storage, "done")
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.finished, report.live) == (1, 1)
    assert set(entries(alias)) == {"open"}

    lose_queue(redis_client, storage.prefix)
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert report.recreated == 1
    assert q.get_status("done") is None  # finished before the loss: not run again
    assert q.get_status("open").state is JobState.QUEUED


def test_reconcile_trusts_the_mirror_for_a_finished_job_whose_record_is_gone(q, storage, alias):
    from django_jobq.models import Job

    q.enqueue("expired", 1)
    finish(storage, "expired")
    storage.delete_finished(QUEUE, ["expired"])  # its record expired before any reconcile
    now = dt.datetime.now(dt.UTC)
    Job.objects.using(alias).create(
        queue=QUEUE, job_id="expired", state=JobState.COMPLETED, created_at=now, finished_at=now
    )
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.finished, report.recreated) == (1, 0)
    assert entries(alias) == {}


def test_without_the_mirror_jobs_the_retention_removed_are_not_recreated(q, storage, alias):
    """Issue 36: with MIRROR disabled (as here) the retention's removals were forgotten by no
    one, and reconcile re-created (ran again) every finished job the retention removed."""
    from django_jobq.job import Keep, Retention

    q.set_retention(Retention(completed=Keep(count=1)))
    for job_id in ("a", "b", "c"):
        q.enqueue(job_id, 1)
    for job in storage.claim(QUEUE, "w1", 10, 30_000).jobs:  # in order: a, b, c
        storage.complete(QUEUE, job.job_id, job.token, b"1")
    assert [q.get_status(i) is None for i in ("a", "b", "c")] == [True, True, False]
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.recreated, report.finished) == (0, 3), report
    assert entries(alias) == {}
    assert all(q.get_status(i) is None for i in ("a", "b"))  # not run again


def test_obliterate_deletes_the_journal_so_reconcile_brings_nothing_back(q, storage, alias):
    q.enqueue_many([("a", 1), ("b", 2)])
    q.enqueue("later", 3, delay=60_000)
    storage.claim(QUEUE, "w1", 1, 30_000)  # one of them runs

    assert q.obliterate(force=True) == 3
    assert entries(alias) == {}
    assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].recreated == 0
    assert [q.get_status(i) for i in ("a", "b", "later")] == [None, None, None]


@pytest.mark.parametrize("when", ["before the re-creation", "while the obliterate runs"])
def test_reconcile_racing_obliterate_never_brings_an_obliterated_job_back(
    q, storage, alias, monkeypatch, when
):
    """Issue 36, item 8: reconcile reads the journal, an obliterate deletes the queue (its
    records, then its entries), and reconcile, finding the records gone, would re-create the
    jobs the operator just deleted. The re-creation is fenced by the queue's obliteration
    generation, read before the entries: an obliterate in between refuses it."""
    q.enqueue_many([("a", 1), ("b", 2)])
    if when == "while the obliterate runs":  # its keys are gone, its entries not yet
        job_states = storage.job_states

        def obliterate_first(queue, ids):
            monkeypatch.setattr(storage, "job_states", job_states)
            storage.obliterate(QUEUE, force=True)
            return job_states(queue, ids)

        monkeypatch.setattr(storage, "job_states", obliterate_first)
    else:  # Redis lost the queue; an operator obliterates it as reconcile re-creates it
        lose_queue(storage.client, storage.prefix)
        register_queue = storage.register_queue

        def obliterate_first(queue):
            monkeypatch.setattr(storage, "register_queue", register_queue)
            q.obliterate(force=True)
            register_queue(queue)

        monkeypatch.setattr(storage, "register_queue", obliterate_first)
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.recreated, report.fenced) == (0, True), report
    assert [q.get_status(i) for i in ("a", "b")] == [None, None]
    if when == "while the obliterate runs":
        # Reconcile keeps off a queue whose obliterate has not finished (here: it died half
        # way); calling it again finishes, and the entries go with it.
        assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].fenced
        q.obliterate(force=True)
    assert entries(alias) == {}
    q.enqueue("c", 3)  # after the obliterate: a new job, journaled and re-created as usual
    storage.client.delete(storage.keys(QUEUE).job("c"), storage.keys(QUEUE).queued)
    assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].recreated == 1
    assert q.get_status("c") is not None


def test_reconcile_of_a_sharded_queue_s_name_reads_its_partitions_entries(
    storage, redis_client, redis_prefix, alias
):
    """The entries of a sharded queue are its partitions' (``orders~1of3``): asking for
    ``orders`` (``jobq_reconcile orders``, ``runreaper orders``) must reach them."""
    sharded = Queue("jsharded", storage=storage, durability="journal", shards=3)
    sharded.enqueue_many([(f"s{i}", i) for i in range(9)])
    for partition in sharded.partition_names:  # its tag is pinned to a slot range
        keys = list(redis_client.scan_iter(match=storage.keys(partition).everything))
        redis_client.delete(*keys)
    reports = reconcile(storage, ["jsharded"], min_age=0)
    assert sum(r.recreated for r in reports.values()) == 9
    assert all(sharded.get_status(f"s{i}") is not None for i in range(9))


def test_obliterate_refused_for_active_jobs_keeps_the_journal(q, storage, alias):
    q.enqueue("running", 1)
    storage.claim(QUEUE, "w1", 1, 30_000)
    with pytest.raises(QueueBusy):
        q.obliterate()
    assert set(entries(alias)) == {"running"}


def test_obliterate_through_a_queue_not_in_journal_mode_deletes_the_entries_too(
    q, storage, alias, jobq, settings
):
    settings.JOBQ = {**jobq, "QUEUES": {QUEUE: {"durability": "journal"}}}
    q.enqueue("a", 1)
    Queue(QUEUE, storage=storage, durability="redis").obliterate()
    assert entries(alias) == {}
    assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].recreated == 0


def test_clean_deletes_the_entries_of_the_jobs_it_deleted_and_no_other(q, storage, alias):
    q.enqueue_many([("done", 1), ("waiting", 2)])
    finish(storage, "done")  # its entry stays until a reconcile sees it finished ...
    assert set(entries(alias)) == {"done", "waiting"}

    assert q.clean(0) == 1  # ... or the clean that deletes its record
    assert set(entries(alias)) == {"waiting"}
    report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
    assert (report.recreated, report.live) == (0, 1)
    assert q.get_status("done") is None


def test_deleting_finished_jobs_deletes_their_entries_only(q, storage, alias):
    q.enqueue_many([("done", 1), ("waiting", 2)])
    finish(storage, "done")
    assert q.delete(["done", "waiting"]) == 1  # a waiting job is not deleted ...
    assert set(entries(alias)) == {"waiting"}  # ... and keeps its entry
    assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].recreated == 0


def test_purging_dead_letters_deletes_their_entries(q, storage, alias):
    q.enqueue_many([("dead", 1), ("waiting", 2)])
    claimed = storage.claim(QUEUE, "w1", 1, 30_000).jobs[0]
    storage.fail(QUEUE, "dead", claimed.token, b'{"type": "E"}', permanent=True)
    assert q.purge_dead() == 1
    assert set(entries(alias)) == {"waiting"}
    assert reconcile(storage, [QUEUE], min_age=0)[QUEUE].recreated == 0


def test_dry_run_reports_and_changes_nothing(q, storage, redis_client, alias):
    q.enqueue("lost", 1)
    q.enqueue("done", 2)
    finish(storage, "done")
    lose_queue(redis_client, storage.prefix)
    storage.enqueue(QUEUE, q.build("done", 2))  # pretend Redis still has "done" ...
    finish(storage, "done")  # ... finished
    report = reconcile(storage, [QUEUE], min_age=0, dry_run=True)[QUEUE]
    assert (report.recreated, report.finished) == (1, 1)
    assert q.get_status("lost") is None
    assert set(entries(alias)) == {"lost", "done"}


def test_reconcile_reads_the_journal_in_batches(q, storage, redis_client, alias):
    q.enqueue_many([(f"b{i}", i) for i in range(25)])
    lose_queue(redis_client, storage.prefix)
    report = reconcile(storage, [QUEUE], min_age=0, batch=4)[QUEUE]
    assert (report.checked, report.recreated) == (25, 25)
    assert q.counts()[JobState.QUEUED] == 25


def test_entries_younger_than_min_age_are_left_alone(q, storage, redis_client, alias):
    q.enqueue("young", 1)
    lose_queue(redis_client, storage.prefix)
    assert reconcile(storage, [QUEUE], min_age=60)[QUEUE].checked == 0
    assert q.get_status("young") is None


def test_jobq_reconcile_command_reports_per_queue(q, jobq, storage, redis_client, alias):
    q.enqueue("cmd", 1)
    lose_queue(redis_client, storage.prefix)
    out = io.StringIO()
    call_command("jobq_reconcile", "--dry-run", "--min-age", "0", stdout=out)
    assert f"dry run: {QUEUE}: checked 1, live 0, recreated 1" in out.getvalue()
    assert q.get_status("cmd") is None
    out = io.StringIO()
    call_command("jobq_reconcile", QUEUE, "--min-age", "0", stdout=out)
    assert f"{QUEUE}: checked 1, live 0, recreated 1" in out.getvalue()
    assert q.get_status("cmd").state is JobState.QUEUED


def test_the_reaper_reconciles_when_settings_ask_for_the_journal(q, jobq, storage, redis_client):
    jobq_with_journal = {**jobq, "QUEUES": {QUEUE: {"durability": "journal"}}}
    with override_settings(JOBQ=jobq_with_journal):
        reaper = Reaper([QUEUE], storage=storage, mirror=False, schedules=False)
        assert reaper.reconcile_interval == 30.0
        q.enqueue("swept", 1)
        lose_queue(redis_client, storage.prefix)
        reaper.reconcile()
    assert q.get_status("swept").state is JobState.QUEUED
    assert Reaper(storage=storage, mirror=False).reconcile_interval is None  # not configured


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_journal_mode_on_a_storage_without_journal_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="needs the Redis backend"):
        Queue("x", storage=MemoryStorage(), durability="journal")
    with pytest.raises(ConfigurationError, match="'redis' or 'journal'"):
        Queue("x", storage=MemoryStorage(), durability="fsync")


@pytest.mark.parametrize(
    ("jobq", "fragment"),
    [
        ({"BACKEND": "database", "DURABILITY": "journal"}, "needs the Redis backend"),
        ({"BACKEND": "redis", "DURABILITY": "always"}, "JOBQ['DURABILITY']"),
        ({"QUEUES": {"q": {"durability": "disk"}}}, "['durability']"),
        ({"JOURNAL": {"DATABASE_ALIAS": "nope"}}, "JOURNAL']['DATABASE_ALIAS']"),
        ({"JOURNAL": {"MIN_AGE": -1}}, "MIN_AGE"),
        ({"JOURNAL": {"BATCH": 0}}, "BATCH"),
        ({"JOURNAL": {"INTERVAL": 3}}, "unknown JOBQ['JOURNAL'] key"),
    ],
)
def test_bad_durability_settings_are_reported(jobq, fragment):
    with override_settings(JOBQ=jobq):
        assert any(fragment in p for p in check_settings()), check_settings()


def test_a_queue_setting_durability_is_not_a_job_option(settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"jq": {"durability": "journal", "priority": 2}}}
    assert check_settings() == []
    queue = Queue("jq", storage=RedisStorage(client_from_url(settings.REDIS_URL)))
    assert (queue.durability, queue.defaults.priority) == ("journal", 2)


def test_jobq_reconcile_says_so_when_redis_is_unreachable(q, jobq, settings, alias):
    q.enqueue("waiting", 1)
    settings.JOBQ = {**jobq, "REDIS_URL": "redis://127.0.0.1:7299/0"}
    with pytest.raises(CommandError, match="Redis unreachable, nothing"):
        call_command("jobq_reconcile", "--min-age", "0")
    assert set(entries(alias)) == {"waiting"}


def test_jobq_reconcile_refuses_a_backend_without_journal(settings):
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "memory"}
    with pytest.raises(CommandError, match="Redis backend feature"):
        call_command("jobq_reconcile")


@pytest.mark.django_db(transaction=True)
def test_the_rest_api_answers_201_pending_for_a_job_kept_in_the_journal(settings, redis_prefix):
    from django.core.cache import cache
    from rest_framework.test import APIClient

    from django_jobq.api.keys import create_key
    from django_jobq.backend import get_storage, reset_storage

    settings.JOBQ = {
        **settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix, "DURABILITY": "journal",
        "REDIS_URL": "redis://127.0.0.1:7299/0",  # nothing listens: Redis is down
    }  # fmt: skip
    cache.clear()
    client = APIClient()
    key = create_key("journal", queues=("*",), actions=("enqueue",))[1]
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    try:
        response = client.post(f"/jobq/queues/{QUEUE}/jobs/", {"id": "api-1"}, format="json")
    finally:
        get_storage().close()
        reset_storage()
    assert response.status_code == 201, response.content
    assert response.json()["outcome"] == "pending"
    assert set(entries("default")) == {"api-1"}


def test_a_flow_in_journal_mode_is_sent_on_commit_and_survives_a_lost_queue(
    storage, redis_client, alias, jobq, settings
):
    from django_jobq.queue.flows import enqueue_flow, node, resolve_parked

    settings.JOBQ = {**jobq, "DURABILITY": "journal"}
    parent = node(QUEUE, "j-parent", {"p": 1}, children=[node(QUEUE, "j-child", {"c": 1})])
    with transaction.atomic(using=alias):
        results = enqueue_flow(parent, storage=storage)
        assert {r.outcome for r in results.values()} == {EnqueueOutcome.PENDING}
    assert storage.parked(QUEUE) == ["j-parent"]  # sent on commit, parked, not failed
    lose_queue(redis_client, storage.prefix)
    reconcile(storage, [QUEUE], min_age=0)
    assert storage.parked(QUEUE) == ["j-parent"]  # re-created parked, with its children list
    finish(storage, "j-child")
    assert resolve_parked(storage, QUEUE) == 1
    assert storage.get_record(QUEUE, "j-parent").state is JobState.QUEUED
