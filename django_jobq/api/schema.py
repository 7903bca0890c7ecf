"""The OpenAPI 3 document of this API (drf-spectacular), served at ``schema/`` and committed
as ``docs/openapi.yaml``. Paths are relative to where the URLconf is included.

Regenerate the committed file after changing the API (tests/api/test_schema.py compares)::

    DJANGO_SETTINGS_MODULE=tests.settings python manage.py spectacular \\
        --urlconf django_jobq.api.urls --custom-settings django_jobq.api.schema.SETTINGS \\
        --file docs/openapi.yaml
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..validation import JOB_ID_PATTERN, QUEUE_NAME_PATTERN
from .base import JobQView

SETTINGS = {
    "TITLE": "django-jobq API",
    "DESCRIPTION": (
        "Enqueue, inspect, wait for and manage django-jobq jobs over HTTP. Paths are relative "
        "to where `django_jobq.api.urls` is included (e.g. `/jobq/`). See docs/api.md."
    ),
    "VERSION": "0.1.0",
    "COMPONENT_SPLIT_REQUEST": True,
    # The paths accept any segment (a malformed name gets the JSON 404); the schema states
    # the names that can exist.
    "PATH_CONVERTER_OVERRIDES": {
        "jobq_queue": {"type": "string", "pattern": f"^{QUEUE_NAME_PATTERN}$"},
        "jobq_job": {"type": "string", "pattern": f"^{JOB_ID_PATTERN}$"},
    },
    "ENUM_NAME_OVERRIDES": {"JobStateEnum": "django_jobq.states.JobState"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "django_jobq.api.schema.add_links",
        "django_jobq.api.schema.add_path_not_found",
    ],
}
URLCONF = "django_jobq.api.urls"


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "django_jobq.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey", "in": "header", "name": "Authorization",
            "description": "`Api-Key jobq_<prefix>_<secret>` (manage.py jobq_apikey create)",
        }  # fmt: skip


# OpenAPI links: what a client can do next with the answer of an operation (the job id an
# enqueue answered, the name of a created schedule). Clients and tools follow them; the
# schemathesis run in tests/api/test_schema.py walks them as a state machine.
_JOB = {"queue": "$request.path.queue", "job_id": "$response.body#/id"}
_SCHEDULE = {"name": "$response.body#/name"}
LINKS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "enqueue": {
        "GetJobStatus": ("job_status", _JOB),
        "GetJobResult": ("job_result", _JOB),
        "CancelJob": ("job_cancel", _JOB),
        "RetryJob": ("job_retry", _JOB),
    },
    "job_cancel": {
        "RetryJob": (
            "job_retry",
            {"queue": "$request.path.queue", "job_id": "$request.path.job_id"},
        ),
        "GetJobStatus": (
            "job_status",
            {"queue": "$request.path.queue", "job_id": "$request.path.job_id"},
        ),
    },
    "schedule_create": {
        "GetSchedule": ("schedule_get", _SCHEDULE),
        "UpdateSchedule": ("schedule_update", _SCHEDULE),
        "RunSchedule": ("schedule_run", _SCHEDULE),
        "DeleteSchedule": ("schedule_delete", _SCHEDULE),
    },
}


def add_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: add ``LINKS`` to the success answers (2xx with a
    body) of the operations they start from."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            links = (
                LINKS.get(operation.get("operationId", "")) if isinstance(operation, dict) else None
            )
            if not links:
                continue
            for status, response in operation.get("responses", {}).items():
                if str(status).startswith("2") and "content" in response:
                    response["links"] = {
                        name: {"operationId": target, "parameters": dict(parameters)}
                        for name, (target, parameters) in links.items()
                    }
    return result


def add_path_not_found(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular post-processing hook: every operation with a name in its path can answer
    404 (the name is unknown, or breaks the naming rules: the routes accept any segment so that
    such a name gets the JSON error body, not Django's HTML page)."""
    for path_text, path in result.get("paths", {}).items():
        if "{" not in path_text:
            continue
        for operation in path.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["responses"].setdefault(
                    "404", {"description": "unknown, or malformed, name in the path"}
                )
    return result


def generate() -> dict[str, Any]:
    """The schema as a dict, exactly as the schema view serves it."""
    from drf_spectacular.settings import patched_settings

    with patched_settings(SETTINGS):
        return SchemaGenerator(urlconf=URLCONF).get_schema(request=None, public=True)


def render_yaml() -> bytes:
    """The YAML text of docs/openapi.yaml (the file a test keeps in step with the code)."""
    from drf_spectacular.renderers import OpenApiYamlRenderer

    return OpenApiYamlRenderer().render(generate(), renderer_context={})


class SchemaView(SpectacularAPIView):
    """Authenticated like every endpoint but health: any valid credential may read it."""

    authentication_classes = JobQView.authentication_classes
    permission_classes = [IsAuthenticated]
    custom_settings = SETTINGS
    urlconf = URLCONF
    schema = None  # the schema does not describe itself


class RootView(APIView):
    """``GET`` the API's root: every endpoint's path (relative to here, ``{queue}``-style
    placeholders) and the schema's, so that a client or a person who finds ``/jobq/`` learns
    where to go. Authenticated like the schema; the paths are those of the OpenAPI document."""

    authentication_classes = JobQView.authentication_classes
    permission_classes = [IsAuthenticated]
    renderer_classes = JobQView.renderer_classes
    throttle_classes = JobQView.throttle_classes
    schema = None  # not an operation of the document it points to

    # The URLconf's patterns, given by urls.py (``as_view(patterns=...)``): importing that
    # module from here would make the two import each other.
    patterns: Any = None

    def get(self, request: Request) -> Response:
        paths = {}
        for pattern in self.patterns():
            name, route = pattern.name, str(pattern.pattern)
            if name and name not in ("root", "not-found"):
                paths[name] = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        root = request.build_absolute_uri()
        return Response({"schema": root + paths["schema"], "docs": "docs/api.md",
                         "endpoints": paths})  # fmt: skip
