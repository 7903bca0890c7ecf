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
