"""A shop that sends its e-mails through django-jobq on Redis."""

from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "userproject-only-not-secret"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_jobq",
    "shop",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "shop.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Production runs on Redis. Nothing answers on this port: a test that reached Redis instead of
# the test mode would fail with "connection refused".
JOBQ = {
    "REDIS_URL": "redis://127.0.0.1:1/0",
    "QUEUES": {"emails": {"max_attempts": 4, "min_backoff": 30_000}},
}
