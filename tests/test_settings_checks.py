"""`manage.py check` reports bad JOBQ settings; good ones build the configured storage."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_jobq.backend import check_settings, get_storage
from django_jobq.errors import ConfigurationError
from django_jobq.storage.memory import MemoryStorage
from django_jobq.storage.redis.storage import RedisStorage


@pytest.mark.parametrize(
    ("jobq", "fragment"),
    [
        ({"BACKEND": "mongo"}, "BACKEND"),
        ({"REDIS_URL": "http://localhost:6379"}, "REDIS_URL"),
        ({"JOB_DEFAULTS": {"result_ttl": 0}}, "result_ttl"),
        ({"JOB_DEFAULTS": {"result_ttl": 1.5}}, "result_ttl"),
        ({"QUEUES": {"bad name": {}}}, "invalid queue name"),
        ({"QUEUES": {"emails": {"max_attempts": 0}}}, "max_attempts"),
        ({"QUEUES": {"emails": {"retries": 3}}}, "unknown job option"),
        ({"SERDE": "pickle"}, "SERDE"),
        ({"MAX_PAYLOAD_BYTES": -1}, "MAX_PAYLOAD_BYTES"),
        ({"REDIS_ULR": "redis://x"}, "unknown JOBQ key"),
        ({"BACKEND": "database", "DATABASE_ALIAS": "nope"}, "DATABASE_ALIAS"),
        ({"CELERY": {"RESULT_BACKEND": "db+sqlite:///r.db"}}, "Redis result backend"),
        ({"CELERY": {"BROKER_URL": "localhost"}}, "BROKER_URL"),
        ({"CELERY": {"CONSUME_QUEUES": ["celery"]}}, "BROKER_URL is not"),
        ({"CELERY": {"ROUTES": {"proj.add": "bad queue"}}}, "ROUTES"),
        ({"CELERY": {"PREFETCH": 0}}, "PREFETCH"),
        ({"CELERY": {"RESULT_EXPRIES": 5}}, "unknown JOBQ['CELERY'] key"),
        ({"BROADCASTS": {"maxlen": 0}}, "JOBQ['BROADCASTS']['maxlen']"),
        ({"BROADCASTS": {"max_age": 1.5}}, "JOBQ['BROADCASTS']['max_age']"),
        ({"BROADCASTS": {"max_len": 5}}, "unknown JOBQ['BROADCASTS'] key"),
        ({"API": {"FAILED_AUTH_RATE": "lots"}}, "JOBQ['API']['FAILED_AUTH_RATE']"),
        ({"API": {"FAILED_AUTH_RATE": 30}}, "JOBQ['API']['FAILED_AUTH_RATE']"),
    ],
)
@pytest.mark.django_db  # model checks (JSONField support) ask the database for its features
def test_bad_settings_are_reported_by_the_system_check(jobq, fragment):
    with override_settings(JOBQ=jobq):
        assert any(fragment in problem for problem in check_settings())
        with pytest.raises(SystemCheckError, match="django_jobq.E001"):
            call_command("check")


def test_bad_settings_refuse_to_build_a_storage():
    with override_settings(JOBQ={"BACKEND": "mongo"}), pytest.raises(ConfigurationError):
        get_storage()


def test_default_settings_pass_the_check():
    with override_settings(JOBQ={}):
        assert check_settings() == []


def test_memory_backend_is_selectable():
    with override_settings(JOBQ={"BACKEND": "memory"}):
        assert isinstance(get_storage(), MemoryStorage)


@pytest.mark.parametrize("alias", ["default", "pg"])
def test_database_backend_is_selectable_on_sqlite_and_postgres(alias):
    from django_jobq.storage.database import DatabaseStorage

    with override_settings(JOBQ={"BACKEND": "database", "DATABASE_ALIAS": alias}):
        assert check_settings() == []
        storage = get_storage()
        assert isinstance(storage, DatabaseStorage)
        assert storage.using == alias


def test_django_redis_cache_alias_is_used_when_configured(settings):
    caches = {
        "jobq": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": settings.REDIS_URL,
        }
    }
    with override_settings(CACHES=caches, JOBQ={"REDIS_CACHE_ALIAS": "jobq"}):
        storage = get_storage()
        assert isinstance(storage, RedisStorage)
        assert storage.client.ping()


def test_queue_overrides_apply_to_that_queue_only(live_storage):
    from django_jobq.queue import Queue

    with override_settings(JOBQ={"QUEUES": {"emails": {"max_attempts": 7}}}):
        assert Queue("emails", storage=live_storage).defaults.max_attempts == 7
        assert Queue("other", storage=live_storage).defaults.max_attempts == 3


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default", "pg"])
def test_the_connection_budget_names_a_database_the_worker_could_exhaust(monkeypatch):
    """Issue 36, item 3: ``manage.py check --database pg`` (and ``runworker`` at start) warn
    when every handler thread of every process inside ORM code at once would pass the
    server's max_connections; a pool bounds a process by its size instead."""
    from django.db import connections

    from django_jobq.checks import WORKER_OWN_CONNECTIONS, connection_budget

    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT current_setting('max_connections')::int")
        limit = cursor.fetchone()[0] - 3  # superuser_reserved_connections' default
    assert connection_budget(limit, aliases=["pg"]) == []
    (problem,) = connection_budget(limit + 1, aliases=["pg"])
    assert f"can open {limit + 1} connections; the server allows {limit}" in problem
    assert len(connection_budget(limit // 2 + 1, processes=2, aliases=["pg"])) == 1
    with override_settings(JOBQ={"BACKEND": "database", "DATABASE_ALIAS": "pg"}):
        # The worker's own threads count on the queue's database.
        assert connection_budget(limit - WORKER_OWN_CONNECTIONS + 1, aliases=["pg"])
    options = connections["pg"].settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "pool", {"min_size": 2, "max_size": 10})
    assert connection_budget(10_000, processes=limit // 10, aliases=["pg"]) == []
    assert connection_budget(10_000, processes=limit // 10 + 1, aliases=["pg"])
    with pytest.raises(SystemCheckError, match="django_jobq.W002"):
        monkeypatch.delitem(options, "pool")
        with override_settings(JOBQ={"WORKER": {"concurrency": limit + 1}}):
            call_command("check", "--database", "pg", "--fail-level", "WARNING")
