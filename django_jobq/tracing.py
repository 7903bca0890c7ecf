"""OpenTelemetry tracing (optional extra ``otel``: ``opentelemetry-api``).

A producer span around each enqueue call, whose context travels in the job's envelope
(``meta["trace"]``, W3C ``traceparent``/``tracestate``), and a consumer span per attempt in the
worker, child of that context, with the messaging semantic conventions. Cost: without
``opentelemetry-api`` installed, ``active()`` is a constant False after the first call; with
the API but no SDK tracer provider configured (the API alone records nothing), it is an
``isinstance`` per call and jobs stay plain (no envelope, no context); only a configured
provider makes spans, and only a valid producer context is written into a job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_jobq.tracing")

SYSTEM = "django_jobq"  # messaging.system
SCOPE = "django_jobq"  # instrumentation scope of the tracer
TRACE_META = "trace"  # key of the carrier in an envelope's meta

_api: Any = None  # opentelemetry modules once imported; False when not installed
_provider: Any = None  # a provider set by use_provider() (tests, or no global provider)
# (provider, its tracer): get_tracer costs as much as a span, so it is asked once per provider.
_tracer_cache: tuple[Any, Any] = (None, None)


def _modules() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider
        except ImportError:
            _api = False
        else:
            _api = (trace, propagate, context, (NoOpTracerProvider, ProxyTracerProvider))
    return _api


def use_provider(provider: Any) -> None:
    """Trace with ``provider`` instead of OpenTelemetry's global one (None: the global one).
    For tests, and for projects that keep their tracer provider out of the global."""
    global _provider, _tracer_cache
    _provider = provider
    _tracer_cache = (None, None)


def _tracer_provider() -> Any | None:
    api = _modules()
    if not api:
        return None
    provider = _provider if _provider is not None else api[0].get_tracer_provider()
    return None if isinstance(provider, api[3]) else provider


def active() -> bool:
    """True when spans would be recorded: the API is installed and a provider configured."""
    return _tracer_provider() is not None


def _tracer() -> Any:
    global _tracer_cache
    provider = _tracer_provider()
    cached_for, tracer = _tracer_cache
    if cached_for is not provider:
        tracer = provider.get_tracer(SCOPE)  # type: ignore[union-attr]
        _tracer_cache = (provider, tracer)
    return tracer


@contextmanager
def producer_span(queue: str, count: int = 1) -> Iterator[tuple[Any, dict[str, str]]]:
    """A ``send <queue>`` PRODUCER span, current while the block runs; yields the span and the
    carrier to put in the jobs' envelopes. The carrier is empty unless the span is sampled:
    an unsampled enqueue leaves its jobs plain (no envelope to write and decode), and their
    attempts' spans are then sampled on their own, as roots."""
    trace, propagate = _modules()[0], _modules()[1]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with _tracer().start_as_current_span(
        f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().trace_flags.sampled:
            propagate.inject(carrier)
        yield span, carrier


def start_consumer(queue: str, job_id: str, attempt: int, worker_id: str,
                   meta: dict[str, Any]) -> Any:  # fmt: skip
    """Start (not make current) the ``process <queue>`` CONSUMER span of one attempt, child of
    the producer's context when the job carries one."""
    trace, propagate = _modules()[0], _modules()[1]
    carrier = meta.get(TRACE_META)
    parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
    # Samplers see the attributes that matter for a decision; the rest is set only on a
    # recording span, so an unsampled attempt costs the sampling decision and little else.
    span = _tracer().start_span(
        f"process {queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={"messaging.system": SYSTEM, "messaging.destination.name": queue},
    )
    if span.is_recording():
        span.set_attributes({
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": job_id,
            "messaging.consumer.group.name": queue,
            "jobq.attempt": attempt,
            "jobq.worker_id": worker_id,
        })  # fmt: skip
    return span


@contextmanager
def current(span: Any) -> Iterator[None]:
    """Make ``span`` the current span while a handler runs, so its own spans nest under it."""
    trace, _, context = _modules()[0], _modules()[1], _modules()[2]
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        context.detach(token)


def end_consumer(span: Any, outcome: str, error: dict[str, Any] | None) -> None:
    """End an attempt's span with its outcome; a failed attempt records its error as an
    ``exception`` event and an ERROR status."""
    if not span.is_recording():
        span.end()
        return
    trace = _modules()[0]
    span.set_attribute("jobq.outcome", outcome)
    if error is not None and outcome in ("failed", "retrying"):
        span.add_event("exception", {
            "exception.type": str(error.get("type", "")),
            "exception.message": str(error.get("message", "")),
            "exception.stacktrace": str(error.get("traceback", "")),
        })  # fmt: skip
        span.set_attribute("error.type", str(error.get("type", "")))
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(error.get("message", ""))))
    span.end()
