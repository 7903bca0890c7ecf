"""Settings of the example project: a Django site whose jobs run on django_jobq."""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobq",
    "example_project.demo",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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
WSGI_APPLICATION = "example_project.wsgi.application"


def database_from_url(url: str | None) -> dict:
    """``DATABASE_URL`` as most hosts spell it: ``sqlite:///path.sqlite3`` (relative to the
    project) or ``postgres://user:password@host:5432/name``. Unset: SQLite, no server needed."""
    if not url:
        url = "sqlite:///example.sqlite3"
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path[1:] if parts.path.startswith("//") else parts.path.lstrip("/"))
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path if os.path.isabs(path) else BASE_DIR / path,
            # Workers and the web process share this file: wait for the write lock, don't fail.
            "OPTIONS": {"timeout": 20},
        }
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",  # needs: pip install "psycopg[binary]"
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (sqlite or postgres)")


DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

JOBQ = {
    # No BACKEND: the embedded default (the database backend on DATABASES["default"], SQLite
    # here, no server needed). `make demo-redis` sets JOBQ_REDIS_URL to run the same on Redis.
    "REDIS_URL": os.environ.get("JOBQ_REDIS_URL") or None,
    "PREFIX": "jobqdemo",
    "QUEUES": {
        "thumbnails": {"max_attempts": 3, "result_ttl": 3600 * 1000},
        "emails": {"max_attempts": 4, "min_backoff": 200, "max_backoff": 2000},
    },
}

# The REST API at /jobq/ (docs/api.md): session login (the admin's) or an API key from
# `python manage.py jobq_apikey create`. Swagger UI at /jobq/docs/, Redoc at /jobq/redoc/.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {"jobq": "600/min"},
}
# Swagger UI and Redoc served from this project's static files (drf-spectacular-sidecar), not
# from a CDN: they work on a machine without internet access.
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
