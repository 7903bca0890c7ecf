"""The ``JOBQ`` settings dict: its defaults, and reading and checking it.

A leaf of the package: it imports only the plumbing below it (errors, value objects,
validation), never a backend or a feature, so anything may read settings through it.
Everything is read through ``jobq_settings()`` so tests can override ``JOBQ`` with Django's
``override_settings`` and get a fresh view. Which storage the settings select, and its
construction, is ``backend.py``'s.
"""

from __future__ import annotations

import re
from importlib import import_module
from typing import Any

from django.conf import settings

from .errors import ConfigurationError, InvalidOption, JobQError
from .job import JobOptions, Retention
from .validation import (
    is_seconds,
    parse_retention,
    validate_positive_int,
    validate_positive_ms,
    validate_priority,
    validate_queue_name,
    validate_sharded_name,
    validate_shards,
)

DEFAULTS: dict[str, Any] = {
    # "redis", "database", "memory", or a dotted path to a callable returning a Storage.
    # None: "redis" when REDIS_URL or REDIS_CACHE_ALIAS is set, else "database" (the embedded
    # default, on DATABASES["default"]: no server needed with SQLite).
    "BACKEND": None,
    # The Django database alias of the "database" backend (SQLite or PostgreSQL).
    "DATABASE_ALIAS": "default",
    # PostgreSQL: whether the database backend prepares its hot statements (enqueue, claim,
    # completion) once per connection. "auto": yes, unless the alias's OPTIONS set
    # "prepare_threshold" (then psycopg decides, as for every other query); True: always;
    # False: never (a transaction-mode PgBouncer before 1.21, or without
    # max_prepared_statements). docs/settings.md, "The database backend on PostgreSQL".
    "DATABASE_PREPARE": "auto",
    # None with BACKEND "redis": redis://127.0.0.1:6379/0. A Redis Cluster:
    # redis+cluster://host:port,host:port (seed nodes; rediss+cluster:// for TLS).
    "REDIS_URL": None,
    # A django-redis cache alias; when set it wins over REDIS_URL (shares the project's pool).
    "REDIS_CACHE_ALIAS": None,
    "PREFIX": "jobq",
    "SERDE": "json",
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Cap of each queue's event stream. The mirror must not fall this far behind (at ~3 events
    # a job, 100,000 is half a minute at 2,000 jobs/s); if it does, it resyncs the queue.
    "EVENTS_MAXLEN": 100_000,
    # Model mirror of the Redis backend (runs inside runreaper, or as runmirror).
    # LAG_WARNING: seconds behind Redis past which the admin shows a banner; CHECK_INTERVAL:
    # seconds between the reaper's reconciliation checks of rows against Redis (None: never).
    "MIRROR": {
        "ENABLED": True,
        "DATABASE_ALIAS": "default",
        "BATCH": 1000,
        "LAG_WARNING": 30.0,
        "CHECK_INTERVAL": 600.0,
        # Seconds an event may sit read but unacknowledged by a consumer before another
        # mirror takes it over (the reader died: a killed runmirror or runreaper).
        "CLAIM_IDLE": 60.0,
        # A gap on a queue with more waiting and running jobs than this is healed with the
        # counts and a sample of records (SAMPLE per state), not a re-read of every record;
        # the queue returns to exact rows once a full re-read fits in the stream cap.
        "SAMPLE_ABOVE": 20_000,
        "SAMPLE": 250,
    },  # fmt: skip
    # Rows of jobs finished more than this many days ago are deleted by the reaper (None: keep).
    "RETENTION_DAYS": 7,
    # Defaults of every job; per-queue overrides in QUEUES, per-call overrides at enqueue.
    "JOB_DEFAULTS": {
        "max_attempts": 3,
        "result_ttl": 24 * 3600 * 1000,
        "min_backoff": 1000,
        "max_backoff": 3600 * 1000,
        "max_stalls": 1,
        "priority": 0,
    },
    # {"emails": {"max_attempts": 5, ..., "limits": {"rate_max": 10, "rate_window": 1000},
    #             "retention": {"completed": {"count": 1000}, "failed": {"age": 7 * 86400000}}}}
    "QUEUES": {},
    "WORKER": {
        "concurrency": 8,
        "lease": 30_000,  # ms a claim is valid without a heartbeat
        "grace": 30.0,  # seconds in-flight jobs get to finish on SIGTERM
        "reap_interval": 5.0,  # seconds between a worker's own stalled-job sweeps (0: off)
        # Failure handlers (docs/failures.md): a call's lease (ms; a worker killed while one
        # runs leaves it to run again after this), the backoff of a failure handler that
        # raised (ms: failure_backoff doubling up to failure_max_backoff), and how often a
        # worker looks for due calls (seconds).
        "failure_lease": 300_000,
        "failure_backoff": 60_000,
        "failure_max_backoff": 86_400_000,
        "failure_poll": 1.0,
    },
    # schedule_sync_interval: seconds between the reaper's syncs of JOBQ["SCHEDULES"] to
    # Schedule rows (it also syncs on start; None: only on start).
    "REAPER": {"interval": 1.0, "batch": 1000, "schedule_sync_interval": 60.0},
    # "redis": an accepted enqueue lives in Redis only (fastest). "journal" (Redis backend
    # only): it is also written to the database, in the caller's transaction when one is open,
    # and jobq_reconcile re-creates what Redis lost (docs/durability.md). Per queue:
    # QUEUES[q]["durability"]; per Queue object: Queue(durability=...).
    "DURABILITY": "redis",
    "JOURNAL": {
        "DATABASE_ALIAS": "default",  # where journal rows live (the callers' transactions)
        "RECONCILE_INTERVAL": 30.0,  # seconds between the reaper's reconciles (None: never)
        "MIN_AGE": 5.0,  # seconds an entry is left alone (its push may still be on the way)
        "BATCH": 1000,  # entries read and checked per round trip
    },
    # The REST API (django_jobq.api, docs/api.md).
    "API": {
        # Seconds an Idempotency-Key claim holds while its request runs. A web process killed
        # inside the request never answers; after this a retry proceeds (its job id still
        # deduplicates). An enqueue answers in milliseconds, so 30 s is far past any live one.
        "IDEMPOTENCY_LEASE": 30.0,
        # Server tracebacks in job errors answered by the API. False: type and message only
        # (file paths, code lines and library versions stay with the operators; the admin
        # still shows them to staff).
        "TRACEBACKS": False,
        # Failed API-key authentications allowed per client address ("n/period", DRF's rate
        # form); past it the address gets 429 until the window passes, so keys cannot be
        # guessed at the server's speed. "" or None: unlimited.
        "FAILED_AUTH_RATE": "30/min",
        # Anonymous GET health per client address; a credential's requests are not counted.
        "HEALTH_RATE": "120/min",
        # Queues the REST API lets callers create by enqueuing to a new name (every queue
        # costs each worker, reaper and scrape a little); past it an enqueue to a name not
        # known yet answers 403. None or 0: no bound. Python code is not bounded.
        "MAX_QUEUES": 10_000,
    },
    # Periodic schedules declared in code, synced to Schedule rows by the reaper and
    # jobq_schedules --sync (docs/schedules.md): {"name": {"task": ..., "cron": ...}, ...}.
    "SCHEDULES": {},
    # Task functions (@task, django_jobq.tasks): {"task name": "queue"} sends that task's jobs
    # to another queue than its decorator names (docs/tasks.md).
    "ROUTES": {},
    # Celery interoperability (django_jobq.celery_compat, docs/migrating-from-celery.md).
    "CELERY": {
        "BROKER_URL": None,  # kombu URL: publish(), and the bridge of CONSUME_QUEUES
        "CONSUME_QUEUES": [],  # Celery queues runworker bridges without --from-kombu
        "ROUTES": {},  # {"celery.task.name": "jobq-queue"} for tasks run by a plain @handler
        "RESULT_BACKEND": None,  # redis:// URL of Celery's result backend, written for its tasks
        "RESULT_EXPIRES": 86400,  # seconds, as Celery's result_expires
        "UNROUTABLE_QUEUE": "celery-unroutable",  # messages that cannot run are kept here
        "PREFETCH": 100,  # unacknowledged messages the bridge holds at once
    },
    # Prometheus metrics (django_jobq.metrics, docs/observability.md; extra "metrics").
    "METRICS": {
        "ENABLED": False,  # count job signals in every process from start-up
        "ALLOWED_IPS": [],  # networks that may read the metrics view without credentials
    },
    # Retention of every broadcast (docs/broadcast.md): at most maxlen messages, none older
    # than max_age ms (None: unbounded); per broadcast, Broadcast(name, maxlen=, max_age=).
    "BROADCASTS": {"maxlen": 100_000, "max_age": 7 * 24 * 3600 * 1000},
}

DURABILITIES = ("redis", "journal")
# Keys of JOBQ["QUEUES"][q] that are queue settings, not job option defaults.
QUEUE_SETTING_NAMES = ("limits", "durability", "retention", "shards")
OPTION_NAMES = tuple(JobOptions.__dataclass_fields__)


def jobq_settings() -> dict[str, Any]:
    user = getattr(settings, "JOBQ", {}) or {}
    merged = {**DEFAULTS, **user}
    for nested in (
        "JOB_DEFAULTS",
        "WORKER",
        "REAPER",
        "MIRROR",
        "CELERY",
        "JOURNAL",
        "METRICS",
        "API",
        "BROADCASTS",
    ):
        merged[nested] = {**DEFAULTS[nested], **user.get(nested, {})}
    if merged["BACKEND"] is None:
        redis_given = merged["REDIS_URL"] or merged["REDIS_CACHE_ALIAS"]
        merged["BACKEND"] = "redis" if redis_given else "database"
    if merged["REDIS_URL"] is None:
        merged["REDIS_URL"] = "redis://127.0.0.1:6379/0"
    return merged


def validate_options(options: dict[str, Any], where: str) -> JobOptions:
    """Turn an options dict into JobOptions, with an error that names where it came from."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise ConfigurationError(f"{where}: unknown job option(s) {sorted(unknown)}")
    try:
        return JobOptions(
            max_attempts=validate_positive_int("max_attempts", options["max_attempts"]),
            result_ttl=validate_positive_ms("result_ttl", options["result_ttl"]),
            min_backoff=validate_positive_ms(
                "min_backoff", options["min_backoff"], allow_zero=True
            ),
            max_backoff=validate_positive_ms(
                "max_backoff", options["max_backoff"], allow_zero=True
            ),
            max_stalls=validate_positive_int("max_stalls", options["max_stalls"], minimum=0),
            priority=validate_priority(options["priority"]),
        )
    except JobQError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc


def queue_defaults(queue: str) -> JobOptions:
    conf = jobq_settings()
    overrides = {
        k: v for k, v in conf["QUEUES"].get(queue, {}).items() if k not in QUEUE_SETTING_NAMES
    }
    return validate_options({**conf["JOB_DEFAULTS"], **overrides}, f"JOBQ['QUEUES'][{queue!r}]")


def queue_durability(queue: str) -> str:
    """``QUEUES[queue]["durability"]`` when set, else the global ``DURABILITY``."""
    conf = jobq_settings()
    value = conf["QUEUES"].get(queue, {}).get("durability", conf["DURABILITY"])
    return validate_durability(value, f"JOBQ['QUEUES'][{queue!r}]['durability']")


def validate_durability(value: object, where: str) -> str:
    if value not in DURABILITIES:
        raise ConfigurationError(f"{where} {value!r}: use 'redis' or 'journal'")
    return str(value)


def journal_in_settings() -> bool:
    """True when the settings put any queue in journal mode (the reaper then reconciles)."""
    conf = jobq_settings()
    return conf["DURABILITY"] == "journal" or any(
        isinstance(q, dict) and q.get("durability") == "journal" for q in conf["QUEUES"].values()
    )


LIMIT_NAMES = ("rate_max", "rate_window", "group_rate_max", "group_rate_window", "concurrency")


def configured_limits(queue: str) -> dict[str, int] | None:
    """The flow-control limits JOBQ['QUEUES'][queue]['limits'] sets, or None when unset.
    Workers apply them when they start, so settings stay the source of truth."""
    limits = jobq_settings()["QUEUES"].get(queue, {}).get("limits")
    if limits is None:
        return None
    where = f"JOBQ['QUEUES'][{queue!r}]['limits']"
    if not isinstance(limits, dict):
        raise ConfigurationError(f"{where} must be a dict")
    unknown = set(limits) - set(LIMIT_NAMES)
    if unknown:
        raise ConfigurationError(f"{where}: unknown limit(s) {sorted(unknown)}")
    try:
        for name, value in limits.items():
            if name.endswith("window"):
                validate_positive_ms(name, value)
            else:
                validate_positive_int(name, value)
    except JobQError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc
    for count, window in (("rate_max", "rate_window"), ("group_rate_max", "group_rate_window")):
        if (count in limits) != (window in limits):
            raise ConfigurationError(f"{where}: {count} and {window} go together")
    return dict(limits)


def configured_shards(logical: str) -> int:
    """``JOBQ["QUEUES"][logical]["shards"]`` (1 when unset); validated."""
    value = jobq_settings()["QUEUES"].get(logical, {}).get("shards", 1)
    where = f"JOBQ['QUEUES'][{logical!r}]['shards']"
    try:
        count = validate_shards(value, where)
        validate_sharded_name(logical, count)
    except InvalidOption as exc:
        raise ConfigurationError(str(exc)) from None
    return count


def configured_retention(queue: str) -> Retention | None:
    """The policy ``JOBQ['QUEUES'][queue]['retention']`` sets (validated), or None when the
    settings say nothing for the queue (then storage keeps whatever was set last)."""
    raw: Any = jobq_settings()["QUEUES"].get(queue, {}).get("retention")
    if raw is None:
        return None
    where = f"JOBQ['QUEUES'][{queue!r}]['retention']"
    try:
        return parse_retention(raw, where)
    except InvalidOption as exc:
        raise ConfigurationError(str(exc)) from exc


def settings_problems() -> list[str]:
    """Problems with JOBQ, as messages, but for the backend's own options (the URL, the
    database alias: ``backend.check_settings`` adds those)."""
    conf = jobq_settings()
    problems = []
    unknown = set(getattr(settings, "JOBQ", {}) or {}) - set(DEFAULTS)
    if unknown:
        problems.append(f"unknown JOBQ key(s) {sorted(unknown)}")
    try:
        validate_options(conf["JOB_DEFAULTS"], "JOBQ['JOB_DEFAULTS']")
        for name in conf["QUEUES"]:
            validate_queue_name(name)
            queue_defaults(name)
            configured_limits(name)
            configured_retention(name)
            configured_shards(name)
    except JobQError as exc:
        problems.append(str(exc))
    if conf["SERDE"] not in ("json", "msgpack"):
        problems.append(f"JOBQ['SERDE'] {conf['SERDE']!r}: use 'json' or 'msgpack'")
    days = conf["RETENTION_DAYS"]
    if days is not None and (
        not is_seconds(days) or days <= 0  # finite: a number of days
    ):
        problems.append(f"JOBQ['RETENTION_DAYS'] must be a positive number or None, got {days!r}")
    mirror_alias = conf["MIRROR"]["DATABASE_ALIAS"]
    if mirror_alias not in settings.DATABASES:
        problems.append(f"JOBQ['MIRROR']['DATABASE_ALIAS'] {mirror_alias!r} is not in DATABASES")
    problems += _check_celery(conf["CELERY"])
    problems += _check_routes(conf["ROUTES"])
    problems += _check_api(conf["API"])
    problems += _check_journal(conf)
    problems += _check_broadcasts(conf["BROADCASTS"])
    size = conf["MAX_PAYLOAD_BYTES"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append(f"JOBQ['MAX_PAYLOAD_BYTES'] must be a positive integer, got {size!r}")
    return problems


def _check_broadcasts(broadcasts: dict[str, Any]) -> list[str]:
    """The documented retention keys, each a positive integer or None (``Broadcast`` checks
    its own arguments the same way when it is built)."""
    unknown = set(broadcasts) - set(DEFAULTS["BROADCASTS"])
    if unknown:
        return [f"unknown JOBQ['BROADCASTS'] key(s) {sorted(unknown)}"]
    problems = []
    for key in ("maxlen", "max_age"):
        value = broadcasts[key]
        bad = isinstance(value, bool) or not isinstance(value, int) or value < 1
        if value is not None and bad:
            problems.append(f"JOBQ['BROADCASTS'][{key!r}] must be a positive integer or None, "
                            f"got {value!r}")  # fmt: skip
    return problems


def _check_journal(conf: dict[str, Any]) -> list[str]:
    problems = []
    try:
        validate_durability(conf["DURABILITY"], "JOBQ['DURABILITY']")
        for name in conf["QUEUES"]:
            queue_durability(name)
    except JobQError as exc:
        return [str(exc)]
    if journal_in_settings() and conf["BACKEND"] in ("database", "memory"):
        problems.append(
            f"durability 'journal' needs the Redis backend: the {conf['BACKEND']} backend keeps "
            "no second copy to reconcile (the database backend already commits every job in "
            "the database; use durability 'redis' there)"
        )
    journal = conf["JOURNAL"]
    unknown = set(journal) - set(DEFAULTS["JOURNAL"])
    if unknown:
        problems.append(f"unknown JOBQ['JOURNAL'] key(s) {sorted(unknown)}")
    if journal["DATABASE_ALIAS"] not in settings.DATABASES:
        problems.append(
            f"JOBQ['JOURNAL']['DATABASE_ALIAS'] {journal['DATABASE_ALIAS']!r} is not in DATABASES"
        )
    for key, allow_none in (("RECONCILE_INTERVAL", True), ("MIN_AGE", False)):
        value = journal[key]
        if value is None and allow_none:
            continue
        if not is_seconds(value) or value < 0:
            problems.append(
                f"JOBQ['JOURNAL']['{key}'] must be a number of seconds >= 0, got {value!r}"
            )
    batch = journal["BATCH"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append(f"JOBQ['JOURNAL']['BATCH'] must be a positive integer, got {batch!r}")
    return problems


def _check_api(api: dict[str, Any]) -> list[str]:
    problems = []
    unknown = set(api) - set(DEFAULTS["API"])
    if unknown:
        problems.append(f"unknown JOBQ['API'] key(s) {sorted(unknown)}")
    lease = api["IDEMPOTENCY_LEASE"]
    if not is_seconds(lease) or lease <= 0:
        problems.append(
            f"JOBQ['API']['IDEMPOTENCY_LEASE'] must be a finite number of seconds > 0, got "
            f"{lease!r}"
        )
    if not isinstance(api["TRACEBACKS"], bool):
        problems.append(
            f"JOBQ['API']['TRACEBACKS'] must be True or False, got {api['TRACEBACKS']!r}"
        )
    most = api["MAX_QUEUES"]
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 0):
        problems.append(
            f"JOBQ['API']['MAX_QUEUES'] must be a whole number >= 0 (or None), got {most!r}"
        )
    for name in ("FAILED_AUTH_RATE", "HEALTH_RATE"):
        rate = api[name]
        if rate not in ("", None) and not (
            isinstance(rate, str) and re.fullmatch(r"[1-9][0-9]*/(s|m|h|d)[a-z]*", rate)
        ):
            problems.append(
                f"JOBQ['API']['{name}'] must be a rate such as \"30/min\" (or \"\" for "
                f"none), got {rate!r}"
            )
    return problems


def _check_routes(routes: object) -> list[str]:
    if not isinstance(routes, dict):
        return ["JOBQ['ROUTES'] must be a dict of task name -> queue"]
    problems = []
    for name, queue in routes.items():
        try:
            validate_queue_name(queue)
        except JobQError as exc:
            problems.append(f"JOBQ['ROUTES'][{name!r}]: {exc}")
    return problems


def _check_celery(celery: dict[str, Any]) -> list[str]:
    problems = []
    unknown = set(celery) - set(DEFAULTS["CELERY"])
    if unknown:
        problems.append(f"unknown JOBQ['CELERY'] key(s) {sorted(unknown)}")
    for key in ("BROKER_URL", "RESULT_BACKEND"):
        url = celery.get(key)
        if url is not None and (not isinstance(url, str) or "://" not in url):
            problems.append(f"JOBQ['CELERY']['{key}'] {url!r} is not a URL")
    backend = celery.get("RESULT_BACKEND")
    if isinstance(backend, str) and not backend.startswith(("redis://", "rediss://", "unix://")):
        problems.append(
            f"JOBQ['CELERY']['RESULT_BACKEND'] {backend!r}: only Celery's Redis result backend "
            "format is written (redis://, rediss://, unix://)"
        )
    queues = celery.get("CONSUME_QUEUES")
    if not isinstance(queues, list | tuple) or not all(isinstance(q, str) and q for q in queues):
        problems.append("JOBQ['CELERY']['CONSUME_QUEUES'] must be a list of queue names")
    elif queues and not celery.get("BROKER_URL"):
        problems.append("JOBQ['CELERY']['CONSUME_QUEUES'] is set but BROKER_URL is not")
    routes = celery.get("ROUTES")
    if not isinstance(routes, dict):
        problems.append("JOBQ['CELERY']['ROUTES'] must be a dict of task name -> queue")
    else:
        for task, queue in routes.items():
            try:
                validate_queue_name(queue)
            except JobQError as exc:
                problems.append(f"JOBQ['CELERY']['ROUTES'][{task!r}]: {exc}")
    for key in ("RESULT_EXPIRES", "PREFETCH"):
        value = celery.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"JOBQ['CELERY']['{key}'] must be a positive integer, got {value!r}")
    try:
        validate_queue_name(celery.get("UNROUTABLE_QUEUE"))
    except JobQError as exc:
        problems.append(f"JOBQ['CELERY']['UNROUTABLE_QUEUE']: {exc}")
    return problems


# Names that moved to ``backend.py`` (the docs showed ``from django_jobq.conf import
# get_storage`` before the package was restructured): looked up there only when asked for, so
# this module still imports nothing above it.
_MOVED = ("build_storage", "check_settings", "get_storage", "reset_storage", "set_test_storage")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(import_module("django_jobq.backend"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
