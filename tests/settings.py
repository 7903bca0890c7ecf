"""Settings for the test suite: real Redis on loopback, SQLite for Django's own tables."""

import json
import os
import tempfile

SECRET_KEY = "tests-only-not-secret"  # noqa: S105
DEBUG = False
# Loopback servers of the tests: uvicorn (tests/test_async_producers.py,
# tests/api/test_event_stream.py) and runserver (the event stream).
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobq",
    "tests.jobsapp",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]
# The admin (tests/test_schedules.py drives the Schedule admin through the test client).
ROOT_URLCONF = "tests.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
# The live server of the browser tests (tests/test_admin_browser.py) serves the admin's CSS.
STATIC_URL = "/static/"
# A file, not :memory:, so that worker threads (each with its own connection) share it.
SQLITE_TEST_FILE = os.environ.get(
    "JOBQ_TEST_SQLITE", os.path.join(tempfile.gettempdir(), f"jobq-test-{os.getpid()}.sqlite3")
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE_TEST_FILE,
        "TEST": {"NAME": SQLITE_TEST_FILE},
        "OPTIONS": {"timeout": 20},
    },
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBQ_TEST_PG_DB", "jobq"),
        "USER": os.environ.get("JOBQ_TEST_PG_USER", "postgres"),
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "TEST": {"NAME": os.environ.get("JOBQ_TEST_PG_DB", "test_jobq"), "DEPENDENCIES": []},
    },
}
if os.environ.get("JOBQ_TEST_PG_POOL"):  # Django's connection pool (psycopg_pool), this size
    size = int(os.environ["JOBQ_TEST_PG_POOL"])
    DATABASES["pg"]["OPTIONS"] = {"pool": {"min_size": 1, "max_size": size, "timeout": 10}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
REDIS_URL = os.environ.get("JOBQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Subprocess tests (runworker, runreaper) pass their test's own key prefix through the env.
JOBQ = {
    # Subprocess tests of the database backend set these two (see test_database_processes.py).
    "BACKEND": os.environ.get("JOBQ_TEST_BACKEND", "redis"),
    "DATABASE_ALIAS": os.environ.get("JOBQ_TEST_DB_ALIAS", "default"),
    "REDIS_URL": REDIS_URL,
    "PREFIX": os.environ.get("JOBQ_TEST_PREFIX", "jobqtest"),
    # Subprocess reapers must not mirror into (or purge) a database nobody migrated for them;
    # tests/test_mirror.py drives the mirror and retention directly.
    "MIRROR": {
        "ENABLED": os.environ.get("JOBQ_TEST_MIRROR") == "1",
        "DATABASE_ALIAS": os.environ.get("JOBQ_TEST_MIRROR_ALIAS", "default"),
        "CLAIM_IDLE": float(os.environ.get("JOBQ_TEST_MIRROR_CLAIM_IDLE", "60")),
    },
    # tests/test_mirror_processes.py: a small cap, so the stream is trimmed many times over.
    "EVENTS_MAXLEN": int(os.environ.get("JOBQ_TEST_EVENTS_MAXLEN", "100000")),
    "RETENTION_DAYS": None,
    # tests/test_schedule_sync.py: schedules declared for subprocess reapers, as JSON.
    "SCHEDULES": json.loads(os.environ.get("JOBQ_TEST_SCHEDULES", "{}")),
    # tests/test_task_handles_processes.py: task names routed to other queues, as JSON.
    "ROUTES": json.loads(os.environ.get("JOBQ_TEST_ROUTES", "{}")),
    # tests/cluster/test_cluster_sharding.py: queue settings (shards) for subprocess workers.
    "QUEUES": json.loads(os.environ.get("JOBQ_TEST_QUEUES", "{}")),
}

# Django's Tasks framework on django_jobq (tests/test_tasks_backend.py swaps the storage in).
TASKS = {
    "default": {
        "BACKEND": "django_jobq.contrib.tasks_backend.JobQBackend",
        "QUEUES": ["default", "tasks-other"],
        "OPTIONS": {"JOB_OPTIONS": {"max_attempts": 2, "min_backoff": 10, "max_backoff": 20}},
    }
}

# The REST API (tests/api/): the project's own DRF authentication beside django_jobq's API keys.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# Swagger UI and Redoc from local static files (tests/test_admin_browser.py checks no page
# refers to another host).
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
