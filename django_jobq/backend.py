"""The one place that chooses and builds the storage, from ``JOBQ`` (Django's ``TasksHandler``
shape: the handler reads the setting, the backends get their options as arguments).

Why here and not in ``conf.py`` or in each backend: a backend that read settings itself could
not be built twice with different options in one process (tests, a second Redis), and a
settings module that imported the backends would sit in the middle of every import cycle. So
``conf.py`` only reads and checks ``JOBQ``; this module turns it into constructor arguments
(the database alias and its prepare mode, the handler names the database rows show, the Redis
client, prefix and stream cap) and caches the process's storage; storage modules never import
``conf``, the registry or anything above them.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from . import conf
from .errors import ConfigurationError

BACKENDS = ("redis", "database", "memory")
DATABASE_ENGINES = ("sqlite3", "postgresql")

# The storage of django_jobq.testing's test mode while it is on. It wins over JOBQ instead of
# being put into JOBQ with override_settings: a test that changes JOBQ meanwhile (pytest-django's
# ``settings`` fixture) stays on it, and no settings override can be undone out of order.
_test_storage: Any = None
_storage = None
_lock = threading.Lock()


def check_settings() -> list[str]:
    """Problems with JOBQ, as messages (the system check, and every storage build): the
    settings' own (``conf.settings_problems``) and the chosen backend's."""
    return _backend_problems(conf.jobq_settings()) + conf.settings_problems()


def _backend_problems(jobq: dict[str, Any]) -> list[str]:
    from .storage.database.core import prepare_problem

    problems = []
    backend = jobq["BACKEND"]
    if backend not in BACKENDS and not (isinstance(backend, str) and "." in backend):
        problems.append(
            f"JOBQ['BACKEND'] {backend!r}: use 'redis', 'database', 'memory' or a dotted path"
        )
    if backend == "database":
        alias = jobq["DATABASE_ALIAS"]
        if alias not in settings.DATABASES:
            problems.append(f"JOBQ['DATABASE_ALIAS'] {alias!r} is not in DATABASES")
        elif str(settings.DATABASES[alias].get("ENGINE", "")).rsplit(".", 1)[-1] not in (
            DATABASE_ENGINES
        ):
            problems.append(
                f"JOBQ['DATABASE_ALIAS'] {alias!r}: the database backend supports SQLite and "
                "PostgreSQL"
            )
    if (problem := prepare_problem(jobq["DATABASE_PREPARE"])) is not None:
        problems.append(f"JOBQ['DATABASE_PREPARE'] {problem}")
    if backend == "redis" and not jobq["REDIS_CACHE_ALIAS"]:
        from .storage.redis.connection import url_problem

        if (problem := url_problem(jobq["REDIS_URL"])) is not None:
            problems.append(f"JOBQ['REDIS_URL'] {problem}")
    return problems


def build_storage() -> Any:
    """A new storage as ``JOBQ`` describes it (``ConfigurationError`` on a bad setting)."""
    jobq = conf.jobq_settings()
    problems = check_settings()
    if problems:
        raise ConfigurationError("; ".join(problems))
    backend = jobq["BACKEND"]
    if backend == "database":
        from .storage.database import DatabaseStorage
        from .tasks.registry import handler_name

        return DatabaseStorage(
            jobq["DATABASE_ALIAS"], prepare=jobq["DATABASE_PREPARE"], handler_names=handler_name
        )
    if backend == "memory":
        from .storage.memory import MemoryStorage

        return MemoryStorage(events_maxlen=jobq["EVENTS_MAXLEN"])
    if backend == "redis":
        from .storage.redis.connection import client_from_cache_alias, client_from_url
        from .storage.redis.storage import RedisStorage

        alias = jobq["REDIS_CACHE_ALIAS"]
        client = client_from_cache_alias(alias) if alias else client_from_url(jobq["REDIS_URL"])
        return RedisStorage(client, prefix=jobq["PREFIX"], events_maxlen=jobq["EVENTS_MAXLEN"])
    return import_string(backend)()


def get_storage() -> Any:
    """The process-wide storage selected by ``JOBQ`` (built once, thread-safe)."""
    global _storage
    if _test_storage is not None:
        return _test_storage
    if _storage is None:
        with _lock:
            if _storage is None:
                _storage = build_storage()
    return _storage


def set_test_storage(storage: Any) -> None:
    """Make ``get_storage()`` return ``storage`` whatever JOBQ says (None: JOBQ again). For
    django_jobq.testing; not for production code."""
    global _test_storage
    _test_storage = storage


def in_test_mode() -> bool:
    """Whether django_jobq.testing's test mode holds the storage (its queues keep no
    journal: a journal-mode queue then behaves as a plain one)."""
    return _test_storage is not None


def reset_storage(**_: Any) -> None:
    global _storage
    with _lock:
        _storage = None


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "JOBQ":
        reset_storage()


setting_changed.connect(_on_setting_changed)
