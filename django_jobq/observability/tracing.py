"""OpenTelemetry tracing (optional extra ``otel``: ``opentelemetry-api``).

A producer span around each enqueue call, whose context travels in the job's envelope
(``meta["trace"]``, W3C ``traceparent``/``tracestate``), and a consumer span per attempt in the
worker, child of that context, with the messaging semantic conventions. Cost: without
``opentelemetry-api`` installed, ``active()`` is a constant False after the first call; with
the API but no SDK tracer provider configured (the API alone records nothing), it is an
``isinstance`` per call and jobs stay plain (no envelope, no context); only a configured
provider makes spans, and only a valid producer context is written into a job.

Unsampled roots (``fastpath.py``): with the SDK's own samplers (``ParentBased`` over
``TraceIdRatioBased`` or a static one, the usual production set-up) the decision for a span
with no parent is taken here, by the SDK's own rule on a trace id drawn from the SDK's own
generator; a dropped root is a light non-recording span, and a sampled one is made by the SDK
with that very trace id, so what is recorded is exactly what the SDK alone would record.

Unsampled sends: a ``send`` span that is not sampled carries no context, but marks its jobs
(``marked``: a plain JSON job with one trailing space, an enveloped one with ``UNSAMPLED_META``),
and under ``ParentBased`` with its default ``remote_parent_not_sampled`` their attempts are
dropped, as the SDK would drop them under the producer's context (docs/observability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

from . import fastpath

logger = logging.getLogger("django_jobq.tracing")

SYSTEM = "django_jobq"  # messaging.system
SCOPE = "django_jobq"  # instrumentation scope of the tracer
TRACE_META = "trace"  # key of the carrier in an envelope's meta
LINKS_META = "trace_links"  # a flow parent's links: the carriers of its children's sends
# The producer's "not sampled" decision: in an envelope's meta when the job has one anyway,
# else (a plain JSON job) one trailing space after the payload's JSON (``marked``).
UNSAMPLED_META = "trace_unsampled"
# What ``producer_span`` yields for an unsampled send: no carrier, but "not sampled" to mark.
UNSAMPLED: Mapping[str, str] = MappingProxyType({})

_api: Any = None  # opentelemetry modules once imported; False when not installed
_provider: Any = None  # a provider set by use_provider() (tests, or no global provider)
# (provider, its tracer, its fast path or None): get_tracer costs as much as a span, so it is
# asked once per provider.
_tracer_cache: tuple[Any, Any, Any] = (None, None, None)


def _modules() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider
        except ImportError:
            _api = False
        else:  # the last: the context of a root span (no parent, whatever is current)
            _api = (trace, propagate, context, (NoOpTracerProvider, ProxyTracerProvider),
                    context.Context())  # fmt: skip
    return _api


def use_provider(provider: Any) -> None:
    """Trace with ``provider`` instead of OpenTelemetry's global one (None: the global one).
    For tests, and for projects that keep their tracer provider out of the global."""
    global _provider, _tracer_cache
    _provider = provider
    _tracer_cache = (None, None, None)


def _tracer_provider() -> Any | None:
    api = _api if _api is not None else _modules()
    if not api:
        return None
    provider = _provider if _provider is not None else api[0].get_tracer_provider()
    if isinstance(provider, api[3]):
        return None
    # The SDK's provider with no span processor records spans that nothing ever reads: treat
    # it as no provider, so "installed but not exporting" costs what the API alone costs.
    # (Private attributes of the SDK, read defensively: another provider keeps tracing.)
    processors = getattr(getattr(provider, "_active_span_processor", None),
                         "_span_processors", None)  # fmt: skip
    return None if processors == () else provider


def active() -> bool:
    """True when spans would be recorded: the API is installed and a provider configured."""
    return _tracer_provider() is not None


def _tracer() -> Any:
    """The tracer of the provider in use. Per attempt this is one tuple read: the provider was
    looked up by ``active()`` for the batch, and it cannot change under us (OpenTelemetry sets
    the global provider once; ``use_provider`` clears this cache)."""
    tracer = _tracer_cache[1]
    if tracer is not None:
        return tracer
    return _new_tracer()[0]


def _fast() -> Any:
    """The provider's ``fastpath.Fast`` (None when the SDK must decide every span)."""
    if _tracer_cache[1] is not None:
        return _tracer_cache[2]
    return _new_tracer()[1]


def _new_tracer() -> tuple[Any, Any]:
    global _tracer_cache
    provider = _tracer_provider()
    cached_for, tracer, fast = _tracer_cache
    if cached_for is not provider:
        tracer = provider.get_tracer(SCOPE)  # type: ignore[union-attr]
        fast = fastpath.for_tracer(tracer, _modules()[0])
        _tracer_cache = (provider, tracer, fast)
    return tracer, fast


def _start(name: str, kind: Any, attributes: dict[str, Any]) -> Any:
    """Start a span, child of the current one: the SDK's ``start_span``, except for a root
    span (nothing current) whose sampler is one ``fastpath`` knows: decided there."""
    fast = _fast()
    if fast is not None and not _has_current_parent():
        return fast.start(name, kind, attributes, None, None)
    return _tracer().start_span(name, kind=kind, attributes=attributes)


def _has_current_parent() -> bool:
    return _modules()[0].get_current_span().get_span_context().is_valid


@contextmanager
def producer_span(queue: str, count: int = 1) -> Iterator[tuple[Any, Mapping[str, str]]]:
    """A ``send <queue>`` PRODUCER span, current while the block runs; yields the span and the
    carrier to put in the jobs' envelopes. The carrier is empty unless the span is sampled:
    an unsampled enqueue yields ``UNSAMPLED`` (no envelope to write and decode: the jobs are
    marked, see ``marked``), and a worker under a parent-based sampler drops their attempts."""
    trace = _modules()[0]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    span = _start(f"send {queue}", trace.SpanKind.PRODUCER, attributes)
    if not span.is_recording():  # nothing to record an error on, nothing to carry
        with _Current(span):
            yield span, UNSAMPLED
        return
    with trace.use_span(span, end_on_exit=True):
        if not span.get_span_context().trace_flags.sampled:  # RECORD_ONLY
            yield span, UNSAMPLED
            return
        carrier: dict[str, str] = {}
        _modules()[1].inject(carrier)
        yield span, carrier


@contextmanager
def flow_span(queue: str, count: int) -> Iterator[Any]:
    """The span of one ``enqueue_flow`` call (``send flow <queue of the first root>``), current
    while it runs: every job's own ``send`` span is its child, so a flow is one tree."""
    trace = _modules()[0]
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "messaging.batch.message_count": count,
    }
    span = _start(f"send flow {queue}", trace.SpanKind.PRODUCER, attributes)
    if not span.is_recording():
        with _Current(span):
            yield span
        return
    with trace.use_span(span, end_on_exit=True):
        yield span


def start_producer(queue: str, job_id: str) -> tuple[Any, Mapping[str, str]]:
    """Start (not make current) the ``send <queue>`` span of one job of a flow, child of the
    current span; returns it and the carrier for the job's envelope (``UNSAMPLED`` when
    unsampled). The caller ends it once the job is stored."""
    trace, propagate = _modules()[0], _modules()[1]
    span = _start(
        f"send {queue}", trace.SpanKind.PRODUCER,
        {"messaging.system": SYSTEM, "messaging.operation.type": "send",
         "messaging.destination.name": queue, "messaging.message.id": job_id},
    )  # fmt: skip
    if not span.get_span_context().trace_flags.sampled:
        return span, UNSAMPLED
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def marked(content_type: str, payload: bytes) -> bool:
    """Whether a plain job was sent by an unsampled ``send``: a JSON payload with one trailing
    space (``mark``). JSON ignores whitespace, so every worker (an older one included) and
    every reader of the job decodes the same value; jobq's JSON encoder never writes one."""
    return content_type == "json" and payload[-1:] == b" "


def mark(body: bytes) -> bytes:
    """A plain JSON job's payload marked as sent unsampled (see ``marked``)."""
    return body + b" "


def start_consumer(queue: str, job_id: str, attempt: int, worker_id: str,
                   meta: dict[str, Any], unsampled: bool = False) -> Any:  # fmt: skip
    """Start (not make current) the ``process <queue>`` CONSUMER span of one attempt, child of
    the producer's context when the job carries one, else a root (never a child of whatever
    the calling thread has current: an attempt's parent is its job's ``send``). ``unsampled``:
    a plain job marked as sent unsampled (``marked``); its meta may say so too."""
    api = _api or _modules()  # (per attempt: no call when already imported)
    trace = api[0]
    fast = _tracer_cache[2] if _tracer_cache[1] is not None else _fast()
    if (fast is not None and fast.drops_marked and (unsampled or UNSAMPLED_META in meta)
            and TRACE_META not in meta and fast.enabled()):  # fmt: skip
        # Sent unsampled, and the sampler drops a span whose remote parent is not sampled:
        # dropped, as the SDK would drop it with the producer's context (no decision to
        # take: its trace id is drawn only if its context is ever asked for).
        return fast.marked()
    if not meta and fast is not None:  # a plain job (the hot path): a root, no links
        span = fast.decide()
        if span is not None:  # dropped: nothing more to do
            return span
        # Sampled (the SDK decides the same on the same trace id): all attributes at once.
        attributes = _consumer_attributes(queue, job_id, attempt, worker_id)
        return fast.sdk(f"process {queue}", trace.SpanKind.CONSUMER, attributes, None, api[4])
    carrier = meta.get(TRACE_META)
    links = _links(meta.get(LINKS_META)) if LINKS_META in meta else None
    if isinstance(carrier, dict):
        # A sampled producer (the only kind that writes a carrier) makes a recording attempt
        # under the usual parent-based samplers: every attribute goes in at the start, in one
        # dict, which costs the SDK about half of setting them afterwards.
        return _tracer().start_span(
            f"process {queue}", context=_extract(carrier, api[1]),
            kind=trace.SpanKind.CONSUMER, links=links,
            attributes=_consumer_attributes(queue, job_id, attempt, worker_id),
        )  # fmt: skip
    # A root attempt: its sampler decides now. On the fast path the decision reads the trace
    # id alone: a dropped one costs no attributes, a sampled one gets them all at the start,
    # in one dict (half the SDK's cost of setting them afterwards).
    if fast is not None:
        span = fast.decide()
        if span is not None:
            return span
        attributes = _consumer_attributes(queue, job_id, attempt, worker_id)
        return fast.sdk(f"process {queue}", trace.SpanKind.CONSUMER, attributes, links, api[4])
    # Any other sampler sees the attributes that matter for a decision; the rest is set
    # only on a recording span, so an unsampled attempt costs the decision and little else.
    attributes = {"messaging.system": SYSTEM, "messaging.destination.name": queue}
    span = _tracer().start_span(f"process {queue}", context=api[4], kind=trace.SpanKind.CONSUMER,
                                attributes=attributes, links=links)  # fmt: skip
    return _recording_root(span, queue, job_id, attempt, worker_id)


def start_consumers(jobs: Sequence[Any], metas: Sequence[dict[str, Any]],
                    worker_id: str) -> list[Any]:  # fmt: skip
    """``start_consumer`` for each attempt of one claim batch (``jobs``: claimed jobs, with
    ``queue``, ``job_id``, ``attempt``, ``content_type`` and ``payload``, which may be marked
    as sent unsampled, see ``marked``; ``metas``: their envelopes' meta), in order: the same
    spans, drawn in the same order. Why a batch: at 1 % sampling, 99 % of attempts are
    dropped roots, whose whole cost is the call overhead around one trace id draw; here the
    fast path's pieces are bound once per batch and a dropped root costs one draw, one
    comparison and one light span. (The tracer's enabled flag is read once per batch: a
    tracer configurator that disables it takes effect from the next claim.)"""
    fast = _fast()
    if fast is None or not fast.enabled():
        return [start_consumer(c.queue, c.job_id, c.attempt, worker_id, meta,
                               marked(c.content_type, c.payload))
                for c, meta in zip(jobs, metas, strict=True)]  # fmt: skip
    draw, redraw, bound, unsampled = fast.draw, fast.redraw, fast.bound, fast.unsampled
    sent_unsampled = fast.marked if fast.drops_marked else None
    spans = []
    for c, meta in zip(jobs, metas, strict=True):
        if meta:  # a carried context, links or other settings: the general path
            spans.append(start_consumer(c.queue, c.job_id, c.attempt, worker_id, meta))
            continue
        if sent_unsampled is not None and c.payload[-1:] == b" " and c.content_type == "json":
            spans.append(sent_unsampled())  # dropped, nothing drawn (see ``marked``)
            continue
        trace_id = draw() or redraw()
        if trace_id & fastpath.LIMIT >= bound:  # dropped (the sampler's own rule)
            spans.append(unsampled(trace_id))
        else:  # sampled: the SDK makes it with this trace id, every attribute at once
            attributes = _consumer_attributes(c.queue, c.job_id, c.attempt, worker_id)
            spans.append(fast.sampled(trace_id, f"process {c.queue}", _api[0].SpanKind.CONSUMER,
                                      attributes, None, _api[4]))  # fmt: skip
    return spans


_extracted: tuple[Any, Any] = (None, None)  # the last carrier read, and its context


def _extract(carrier: dict[str, str], propagate: Any) -> Any:
    """The context in a job's carrier. The jobs of one ``enqueue_many`` (or one request)
    carry the same one, and a worker claims them together: the last one is kept, which
    spares the propagator's parsing (a seventh of a recorded attempt's cost) for the rest.
    (A Context never changes once made; the tuple is replaced whole, so threads may share it.)"""
    global _extracted
    last_carrier, context = _extracted
    if carrier != last_carrier:
        context = propagate.extract(carrier, context=_api[4])  # read alone, never merged
        _extracted = (dict(carrier), context)
    return context


def _consumer_attributes(queue: str, job_id: str, attempt: int, worker_id: str) -> dict:
    return {
        "messaging.system": SYSTEM, "messaging.destination.name": queue,
        "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.message.id": job_id, "messaging.consumer.group.name": queue,
        "jobq.attempt": attempt, "jobq.worker_id": worker_id,
    }  # fmt: skip


def _recording_root(span: Any, queue: str, job_id: str, attempt: int, worker_id: str) -> Any:
    """A root attempt's span with the rest of its attributes, when it records."""
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


def _links(carriers: Any) -> list[Any] | None:
    """Links to the ``send`` spans of a flow parent's children (their carriers, kept in the
    parent's envelope): the parent's attempt runs because of them, but in its own trace
    position (child of its own ``send``)."""
    if not isinstance(carriers, list):
        return None
    trace, propagate = _modules()[0], _modules()[1]
    links = []
    for carrier in carriers:
        if isinstance(carrier, dict):
            context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
            if context.is_valid:
                links.append(trace.Link(context))
    return links or None


@contextmanager
def current(span: Any) -> Iterator[None]:
    """Make ``span`` the current span while a block runs (``attach`` / ``detach``)."""
    token = attach(span)
    try:
        yield
    finally:
        detach(token)


def attach(span: Any) -> Any:
    """Make ``span`` the current span until ``detach(token)``: a handler's own spans nest
    under its attempt's. An unsampled attempt is made current too: under the usual
    parent-based samplers its handler's spans are then dropped with it, instead of starting
    traces of their own. (Two plain calls rather than a context manager: this runs per
    attempt, and a generator-based one cost as much again.)"""
    var = _var if _var is not _UNSET else _context_var()
    if var is None:
        api = _api
        return api[2].attach(api[0].set_span_in_context(span))
    values = var.get().copy()  # what set_span_in_context and attach do, in one step
    values[_SPAN_KEY] = span
    return var.set(_Context(values))


def call_in(span: Any, func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` with ``span`` current: ``attach``, the call, ``detach``, in one frame
    (the worker runs each traced attempt's handler through it)."""
    var = _var if _var is not _UNSET else _context_var()
    if var is None:
        api = _api
        token = api[2].attach(api[0].set_span_in_context(span))
        try:
            return func(*args)
        finally:
            api[2].detach(token)
    current = var.get()
    if current:
        values = current.copy()
        values[_SPAN_KEY] = span
    else:  # a handler thread's usual context: nothing else in it
        values = {_SPAN_KEY: span}
    token = var.set(_Context(values))
    try:
        return func(*args)
    finally:
        var.reset(token)


def detach(token: Any) -> None:
    var = _var if _var is not _UNSET else _context_var()
    if var is None:
        _api[2].detach(token)
    else:
        var.reset(token)


_SPAN_KEY: Any = None
_Context: Any = None
_UNSET: Any = object()
_var: Any = _UNSET  # the API's context variable; None when it keeps the context elsewhere


def _context_var() -> Any:
    """The ``ContextVar`` behind the API's runtime context when it is the default one
    (``contextvars_context``, the only one the API ships): setting it directly does what
    ``attach(set_span_in_context(span))`` does, at a third of the calls. None for any other
    runtime context (``OTEL_PYTHON_CONTEXT``): then the API's own calls are used."""
    global _var, _SPAN_KEY, _Context
    if _var is not _UNSET:
        return _var
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    from opentelemetry.trace import propagation

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    key = getattr(propagation, "_SPAN_KEY", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is not ContextVarsRuntimeContext or key is None or var is None:
        _var = None
        return None
    _SPAN_KEY, _Context, _var = key, context.Context, var
    return var


class _Current:
    """The context manager of a producer's unsampled span (a class: no generator per call)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span = span

    def __enter__(self) -> None:
        self._token = attach(self._span)

    def __exit__(self, *exc: object) -> None:
        detach(self._token)


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
