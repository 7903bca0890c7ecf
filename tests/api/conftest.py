"""Fixtures of the REST API tests: the API on the real Redis backend and on the database
backend (SQLite, the embedded default), API keys with chosen scopes, a worker, the mirror."""

from __future__ import annotations

import gc

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from rest_framework.test import APIClient

from django_jobq.api.keys import create_key
from django_jobq.backend import get_storage, reset_storage
from django_jobq.mirror import Mirror
from django_jobq.worker import Worker

API_BACKENDS = ["redis", "sqlite"]


def pytest_collection_modifyitems(items):
    """Every API test touches the database (keys, idempotency, rows); the database backend's
    own threads need committed rows, hence transactional tests."""
    for item in items:
        if "tests/api/" not in str(item.fspath).replace("\\", "/"):
            continue
        params = getattr(item, "callspec", None) and item.callspec.params or {}
        databases = ["default", "pg"] if params.get("api_backend") == "postgres" else ["default"]
        item.add_marker(pytest.mark.django_db(databases=databases, transaction=True))
        if params.get("api_backend") == "redis":
            item.add_marker(pytest.mark.redis)
        if params.get("api_backend") == "postgres":
            item.add_marker(pytest.mark.postgres)


def jobq_settings_for(kind: str, request) -> dict:
    base = {**django_settings.JOBQ, "MIRROR": {"ENABLED": True}}
    if kind == "redis":
        return {**base, "BACKEND": "redis", "PREFIX": request.getfixturevalue("redis_prefix")}
    alias = {"sqlite": "default", "postgres": "pg"}[kind]
    return {**base, "BACKEND": "database", "DATABASE_ALIAS": alias}


@pytest.fixture(params=API_BACKENDS)
def api_backend(request, settings) -> str:
    """The API with JOBQ pointing at one backend (a Redis key prefix of this test's own)."""
    settings.JOBQ = jobq_settings_for(request.param, request)
    cache.clear()  # throttle counters of an earlier test's key with the same pk
    yield request.param
    get_storage().close()
    reset_storage()
    gc.collect()


@pytest.fixture
def make_key(db):
    def make(queues=("*",), actions=("enqueue", "read", "manage"), rate: str = "") -> str:
        return create_key("test", queues=queues, actions=actions, throttle_rate=rate)[1]

    return make


@pytest.fixture
def client_for(make_key):
    """An API client authenticated by a new key with the given scopes."""

    def make(queues=("*",), actions=("enqueue", "read", "manage"), rate: str = "") -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {make_key(queues, actions, rate)}")
        return client

    return make


@pytest.fixture
def api(api_backend, client_for) -> APIClient:
    """A client with every action on every queue."""
    return client_for()


def registered_workers() -> list[str]:
    """Ids of the workers the configured storage lists as live (what /workers and /health
    count): a worker registers itself once it serves."""
    return [record.worker_id for record in get_storage().list_workers()]


@pytest.fixture
def worker(api_backend):
    running = []

    def start(*queues: str) -> Worker:
        w = Worker(list(queues), storage=get_storage(), lease=5000, grace=5)
        w.start()
        running.append(w)
        return w

    yield start
    for w in running:
        w.stop(hurry=True)
        w.stopped.wait(10)


@pytest.fixture
def mirror_now(api_backend):
    """Bring the rows up to date: the Redis mirror drained; the database backend's rows are
    the state already."""

    def run() -> None:
        if api_backend == "redis":
            Mirror(get_storage()).drain()

    return run
