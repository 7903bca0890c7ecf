"""Swagger UI and Redoc pages for the REST API that work offline and tell a logged-out
visitor what to do.

drf-spectacular's own views load the schema with the visitor's session: logged out, Swagger
UI shows only "Failed to load API definition", and Redoc's page pulls its fonts from Google's
CDN (a blank wait on a machine without internet access, a request to a third party on every
other). These subclasses send a visitor without a session to the admin's login page (and back
here after it), and render Redoc with the system's fonts and a policy that keeps it on this
server. The scripts themselves come from
drf-spectacular-sidecar's static files (``SPECTACULAR_SETTINGS = {"SWAGGER_UI_DIST":
"SIDECAR", "REDOC_DIST": "SIDECAR", ...}``, see docs/api.md).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseBase
from django.urls import reverse
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView
from rest_framework.request import Request


def _login_first(request: Request) -> HttpResponseBase | None:
    if request.user and request.user.is_authenticated:
        return None
    return redirect_to_login(request.get_full_path(), reverse("admin:login"))


class JobqSwaggerView(SpectacularSwaggerView):
    """Swagger UI; logged out, the admin's login page instead of an unexplained failure."""

    def get(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return _login_first(request) or super().get(request, *args, **kwargs)


#: Redoc's bundle draws Redocly's logo from cdn.redoc.ly whatever its options; this policy
#: keeps the page on this server (the logo's <img> fails and Redoc drops it).
REDOC_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


class JobqRedocView(SpectacularRedocView):
    """Redoc without external fonts or images; logged out, the admin's login page."""

    template_name = "admin/django_jobq/redoc.html"

    def get(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = _login_first(request) or super().get(request, *args, **kwargs)
        response.setdefault("Content-Security-Policy", REDOC_CSP)
        return response
