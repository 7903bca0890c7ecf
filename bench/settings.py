"""Settings of the throughput/latency benchmark (``python -m bench.core``).

Minimal on purpose: only what the Redis backend and a ``runworker`` need, so the figures measure
django_jobq and not middleware or apps. The key prefix comes from the environment because the
benchmark and its ``runworker`` subprocess must share it, and each run picks a fresh one so it
never touches another run's (or anyone else's) keys.
"""

import os
import tempfile

SECRET_KEY = "bench-only-not-secret"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_jobq",
    "bench.benchapp",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        # Never opened by the benchmark (the Redis backend needs no table); kept out of the repo.
        "NAME": os.environ.get(
            "JOBQ_BENCH_SQLITE", os.path.join(tempfile.gettempdir(), "jobq-bench.sqlite3")
        ),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JOBQ = {
    "BACKEND": "redis",
    "REDIS_URL": os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "PREFIX": os.environ.get("JOBQ_BENCH_PREFIX", "jobqbench"),
    # JOBQ_BENCH_METRICS=1: every process counts its job signals (the cost of the metrics).
    "METRICS": {"ENABLED": os.environ.get("JOBQ_BENCH_METRICS") == "1"},
}
# JOBQ_BENCH_DB=postgres|sqlite: the database backend instead (``python -m bench.core_db``), on
# a PostgreSQL database of the run's own (JOBQ_BENCH_PG_DB) or the SQLite file above.
_BENCH_DB = os.environ.get("JOBQ_BENCH_DB", "")
if _BENCH_DB == "postgres":
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBQ_BENCH_PG_DB", "jobq_bench_db"),
        "USER": os.environ.get("JOBQ_BENCH_PG_USER", "postgres"),
        "HOST": os.environ.get("JOBQ_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("JOBQ_BENCH_PG_PORT", "5432"),
    }
    if os.environ.get("JOBQ_BENCH_PG_PREPARE"):
        # psycopg's prepare_threshold (Django's OPTIONS). Unset, as in Django's default, jobq
        # prepares its own hot statements (JOBQ["DATABASE_PREPARE"] "auto"); set, psycopg
        # applies it to them (and to any other server-bound statement).
        DATABASES["default"]["OPTIONS"] = {
            "prepare_threshold": int(os.environ["JOBQ_BENCH_PG_PREPARE"])
        }
if _BENCH_DB == "sqlite":
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}
if _BENCH_DB:
    JOBQ = {"BACKEND": "database", "METRICS": JOBQ["METRICS"]}
    # JOBQ_BENCH_DB_PREPARE=auto|true|false: JOBQ["DATABASE_PREPARE"] (default "auto").
    _prepare = os.environ.get("JOBQ_BENCH_DB_PREPARE", "auto").lower()
    JOBQ["DATABASE_PREPARE"] = {"true": True, "false": False}.get(_prepare, _prepare)
LOGGING = {"version": 1, "disable_existing_loggers": False}

if os.environ.get("JOBQ_BENCH_TRACING", "0") != "0":
    # bench.observability --mode tracing[-sampled]: a real SDK provider (sampling every trace,
    # or the given ratio of root traces) whose batch processor hands spans to an exporter that
    # drops them, so the figure is django_jobq's and the SDK's cost, not a collector's.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    if os.environ["JOBQ_BENCH_TRACING"] == "noexport":
        # --mode tracing-noexport: the SDK installed and configured, no span processor.
        _provider = TracerProvider()
    else:
        _ratio = float(os.environ["JOBQ_BENCH_TRACING"])
        _provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(_ratio)))
        _provider.add_span_processor(BatchSpanProcessor(_Drop()))
    trace.set_tracer_provider(_provider)
