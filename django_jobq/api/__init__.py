"""The REST API of django_jobq (Django REST framework), an optional extra.

Include it with ``path("jobq/", include("django_jobq.api.urls"))``; install it with
``pip install "django-jobq[api]"``. Only this package imports DRF, so a project without the extra
still loads the app (the API key model and its admin do not need DRF)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


def require_drf() -> None:
    """Fail with the name of the extra to install, not a bare ImportError deep in a URLconf."""
    try:
        import drf_spectacular  # noqa: F401
        import rest_framework  # noqa: F401
    except ImportError as exc:
        raise ImproperlyConfigured(
            "django_jobq.api needs Django REST framework and drf-spectacular: "
            'pip install "django-jobq[api]"'
        ) from exc
