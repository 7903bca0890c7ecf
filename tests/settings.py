"""Settings for the test suite: real Redis on loopback, SQLite for Django's own tables."""

import os

SECRET_KEY = "tests-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_jobq",
    "tests.jobsapp",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
REDIS_URL = os.environ.get("JOBQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Subprocess tests (runworker, runreaper) pass their test's own key prefix through the env.
JOBQ = {
    "BACKEND": "redis",
    "REDIS_URL": REDIS_URL,
    "PREFIX": os.environ.get("JOBQ_TEST_PREFIX", "jobqtest"),
}
