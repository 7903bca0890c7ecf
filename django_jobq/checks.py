"""``manage.py check`` reports a bad JOBQ setting before any worker starts."""

import logging
from collections.abc import Iterable

from django.core import checks

from .backend import check_settings

logger = logging.getLogger("django_jobq")


@checks.register()
def jobq_settings_check(app_configs, **kwargs):
    return [
        checks.Error(problem, hint="See docs/settings.md.", id="django_jobq.E001")
        for problem in check_settings()
    ]


@checks.register()
def schedules_settings_check(app_configs, **kwargs):
    """A bad ``JOBQ["SCHEDULES"]`` entry (bad cron, unknown task, arguments that do not bind,
    NaN in a payload) is refused here, before deploy, and the reaper syncs nothing while one
    is there."""
    from .schedules.sync import check_declared

    try:
        problems = check_declared()
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    return [
        checks.Error(problem, hint="See docs/schedules.md.", id="django_jobq.E002")
        for problem in problems
    ]


@checks.register()
def mirror_sqlite_check(app_configs, **kwargs):
    """The Redis mirror commits to SQLite several times a second. A deferred transaction of
    the project's own that reads, then writes (``update_or_create``, ``get_or_create``,
    ``select_for_update``) fails at once with "database is locked" when any other connection
    committed in between: SQLite cannot wait there, whatever the busy timeout. Immediate
    transactions take the write lock first and wait on the timeout instead."""
    from django.conf import settings

    from .conf import jobq_settings

    try:
        conf = jobq_settings()
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    alias = conf["MIRROR"]["DATABASE_ALIAS"]
    db = settings.DATABASES.get(alias, {})
    mode = str(db.get("OPTIONS", {}).get("transaction_mode") or "").upper()
    if conf["BACKEND"] != "redis" or not conf["MIRROR"]["ENABLED"]:
        return []
    if "sqlite3" not in db.get("ENGINE", "") or mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is SQLite and the Redis mirror writes to it: the project's "
            "own transactions that read before they write can fail with 'database is locked' "
            "while the mirror commits.",
            hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" (and '
            'a "timeout"), or point JOBQ["MIRROR"]["DATABASE_ALIAS"] at PostgreSQL. See '
            "docs/admin.md.",
            id="django_jobq.W001",
        )
    ]


# The worker's own connections per process: the fetcher's claims, the acker's verdicts, the
# heartbeat, the failure-handler thread (Django's per-thread connections) and the LISTEN
# connection of the database backend. Handler threads hold one each only while their
# code uses the ORM (the pools close it after each job unless CONN_MAX_AGE keeps it).
WORKER_OWN_CONNECTIONS = 5
_SERVER_LIMIT_SQL = {
    "postgresql": "SELECT current_setting('max_connections')::int"
    " - current_setting('superuser_reserved_connections')::int",
    "mysql": "SELECT @@max_connections",
}


def connection_budget(
    concurrency: int, processes: int = 1, aliases: Iterable[str] | None = None
) -> list[str]:
    """Why a worker of ``processes`` × ``concurrency`` threads could run a database server
    out of connections ("too many clients") — one message per database at risk. Counted as
    the worst case: every handler thread inside ORM code at once, plus the worker's own on
    the queue's database; with Django's pool, the pool's size bounds a process instead."""
    from django.conf import settings
    from django.db import connections

    from .conf import jobq_settings

    conf = jobq_settings()
    queue_db = conf["DATABASE_ALIAS"] if conf["BACKEND"] == "database" else None
    problems = []
    for alias in settings.DATABASES if aliases is None else aliases:
        conn = connections[alias]
        if conn.vendor not in _SERVER_LIMIT_SQL:
            continue
        own = WORKER_OWN_CONNECTIONS if alias == queue_db else 0
        pool = conn.settings_dict.get("OPTIONS", {}).get("pool")
        if pool:  # psycopg_pool's sizes: max_size defaults to min_size, which defaults to 4
            size = 4
            if isinstance(pool, dict):
                size = pool.get("max_size") or pool.get("min_size") or 4
            per_process, how = size + (1 if own else 0), f"a pool of {size}"
        else:
            per_process, how = concurrency + own, f"{concurrency} handler threads"
        try:
            with conn.cursor() as cursor:
                cursor.execute(_SERVER_LIMIT_SQL[conn.vendor])
                limit = int(cursor.fetchone()[0])
        except Exception as exc:  # noqa: BLE001 - a server that does not answer: said elsewhere
            logger.debug("max_connections of %r not read: %s", alias, exc)
            continue
        if processes * per_process > limit:
            problems.append(
                f"DATABASES[{alias!r}]: {processes} worker process(es) with {how} can open "
                f"{processes * per_process} connections; the server allows {limit}"
            )
    return problems


@checks.register(checks.Tags.database)
def connection_budget_check(app_configs, databases=None, **kwargs):
    """``manage.py check --database …`` with JOBQ["WORKER"]["concurrency"]; ``runworker``
    checks its own ``--concurrency`` and ``--processes`` when it starts."""
    from .conf import jobq_settings

    try:
        concurrency = jobq_settings()["WORKER"]["concurrency"]
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    return [
        checks.Warning(
            problem,
            hint="Lower the concurrency, use Django's pool (OPTIONS['pool'], psycopg_pool), "
            "or raise the server's max_connections. See docs/workers.md.",
            id="django_jobq.W002",
        )
        for problem in connection_budget(concurrency, aliases=databases or ())
    ]


@checks.register()
def atomic_handlers_check(app_configs, **kwargs):
    """``atomic=True`` writes a job's completion (the database backend) or its outcome (the
    Redis ledger) in its handler's transaction: not possible with the memory backend, nor on
    the database backend when the handler says it writes to another database than the
    queue's. Refused here rather than at the first job (docs/reliability.md)."""
    from .conf import jobq_settings
    from .tasks.registry import registry

    try:
        conf = jobq_settings()
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    alias = conf["DATABASE_ALIAS"]
    errors = []
    for queue, writers in sorted(registry.atomic_writers().items()):
        for what, atomic in writers:
            if conf["BACKEND"] == "memory":
                problem = (
                    f"{what} (queue {queue!r}) has atomic=True, which needs the database or"
                    " the Redis backend; JOBQ['BACKEND'] is 'memory'"
                )
            elif conf["BACKEND"] == "database" and isinstance(atomic, str) and atomic != alias:
                problem = (
                    f"{what} (queue {queue!r}) writes to database {atomic!r}, but its jobs are"
                    f" stored in {alias!r} (JOBQ['DATABASE_ALIAS']): the writes and the"
                    " completion cannot commit together"
                )
            else:
                continue
            errors.append(
                checks.Error(problem, hint="See docs/reliability.md.", id="django_jobq.E003")
            )
    return errors
