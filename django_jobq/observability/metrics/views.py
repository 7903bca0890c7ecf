"""The metrics view: ``path("metrics/", include("django_jobq.observability.metrics.urls"))``.

Protected like the REST API, without needing its extra (no DRF here): a staff user of the
session, an API key with the ``read`` action (``Authorization: Api-Key jobq_…``; a key scoped
to some queues sees only their series, and no per-worker series), or a client address in
``JOBQ["METRICS"]["ALLOWED_IPS"]`` (``REMOTE_ADDR`` only: a forwarded-for header is not
trusted; put the allow-list on the proxy when there is one).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ...conf import jobq_settings
from ...errors import ConfigurationError
from ...storage.base import Storage
from . import prometheus, tally
from .broadcasts import BroadcastCollector
from .collectors import StorageCollector, TallyCollector, known_queues

ALL = None  # access to every queue's series


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(n, strict=False)
                for n in jobq_settings()["METRICS"]["ALLOWED_IPS"]]  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"JOBQ['METRICS']['ALLOWED_IPS']: {exc}") from exc


def access(request: HttpRequest) -> set[str] | None:
    """The queues this request may see (None: all), or ``Denied``."""
    header = request.headers.get("Authorization", "")
    if header[:8].lower() == "api-key ":
        from ...api.keys import find_key  # no DRF: keys.py is plain Django

        key = find_key(header[8:].strip())
        if key is None:
            raise Denied(401, "unknown or revoked API key")
        if not key.allows_action("read"):
            raise Denied(403, "this API key lacks the 'read' action")
        return ALL if "*" in key.queues else set(key.queues)
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return ALL
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        addr = None
    if addr is not None and any(addr in net for net in _allowed_networks()):
        return ALL
    raise Denied(401, "staff login, an API key with the 'read' action, or an allowed address")


class _Scoped:
    """Another collector's families, keeping only the series of ``queues``."""

    def __init__(self, inner: Any, queues: set[str]) -> None:
        self.inner, self.queues = inner, queues

    def collect(self) -> Iterator[Any]:
        for family in self.inner.collect():
            kept = [s for s in family.samples if self._visible(s.labels)]
            if kept or not family.samples:
                family.samples = kept
                yield family

    def _visible(self, labels: dict[str, str]) -> bool:
        if "worker" in labels:  # workers serve many queues: not for a queue-scoped key
            return False
        return "queue" not in labels or labels["queue"] in self.queues


def exposition(queues: set[str] | None = ALL) -> bytes:
    """The text a scrape gets: storage gauges, and this process's counters if installed."""
    p = prometheus()
    registry = p.CollectorRegistry(auto_describe=False)

    def pick(storage: Storage) -> Iterable[str]:
        names = known_queues(storage)
        return names if queues is None else [n for n in names if n in queues]

    parts: list[Any] = [StorageCollector(queues=pick)]
    counted = tally.current()
    if counted is not None:
        parts.append(TallyCollector(counted))
    for part in parts:
        registry.register(part if queues is None else _Scoped(part, queues))
    registry.register(BroadcastCollector(queues))  # scoped by itself: no "queue" label
    return bytes(p.generate_latest(registry))


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    try:
        queues = access(request)
    except Denied as denied:
        response = HttpResponse(f"{denied}\n", status=denied.status, content_type="text/plain")
        if denied.status == 401:
            response["WWW-Authenticate"] = "Api-Key"
        return response
    return HttpResponse(exposition(queues), content_type=prometheus().CONTENT_TYPE_LATEST)
