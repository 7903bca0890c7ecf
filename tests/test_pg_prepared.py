"""PostgreSQL enqueues bind on the server and leave preparing to the connection, as Django's
``OPTIONS["prepare_threshold"]`` says: its default (``None``) prepares nothing, which is what a
transaction-mode pooler (PgBouncer before 1.21) needs, since a statement prepared on one server
connection is unknown on the next one there; a threshold of 0 prepares them at once."""

from __future__ import annotations

import pytest
from django.db import connections

from django_jobq.job import EnqueueOutcome, JobOptions, NewJob
from django_jobq.storage.database import DatabaseStorage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]


def prepared() -> list[str]:
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("threshold", ["unset", 0])
def test_enqueues_prepare_only_when_the_connection_is_configured_to(threshold):
    settings_dict = connections["pg"].settings_dict
    saved = dict(settings_dict.get("OPTIONS") or {})
    if threshold != "unset":
        settings_dict["OPTIONS"] = {**saved, "prepare_threshold": threshold}
    storage = DatabaseStorage("pg")
    try:
        connections["pg"].close()  # the next query connects with these OPTIONS
        for i in range(3):
            out = storage.enqueue_many("prep", [NewJob(f"j{i}-{k}", b"1", JobOptions())
                                                for k in range(3)])  # fmt: skip
            assert {o.outcome for o in out} == {EnqueueOutcome.QUEUED}
            one = storage.enqueue("prep", NewJob(f"one{i}", b"1", JobOptions()))
            assert one.outcome is EnqueueOutcome.QUEUED
        statements = [s for s in prepared() if "jobq" in s.lower()]
        if threshold == "unset":
            assert statements == []
        else:
            assert any("unnest" in s for s in statements), statements
    finally:
        settings_dict["OPTIONS"] = saved
        connections["pg"].close()
        storage.close()
