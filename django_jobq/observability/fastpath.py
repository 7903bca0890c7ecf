"""Root spans that the sampler drops, without the OpenTelemetry SDK's ``start_span``.

Why: with 1 % of traces sampled, 99 % of attempts make a span that records nothing, and the
SDK's ``start_span`` for it (ids, a sampling result object, a ``SpanContext``, a
``NonRecordingSpan``, its own bookkeeping) cost a no-op job about 9 % of its worker CPU.

How, without changing what is recorded: for the SDK's own samplers whose decision for a span
*with no parent* depends on the trace id alone (``ParentBased`` — ``ParentBasedTraceIdRatio``
included — over ``TraceIdRatioBased`` or a static sampler, or those used bare), the rule is
"sampled when the trace id's low 64 bits are under the sampler's ``bound``". ``Fast.start``
draws the trace id from the provider's own id generator and applies that rule:

- dropped: an ``Unsampled`` span, a ``NonRecordingSpan`` whose ``SpanContext`` (the drawn
  trace id, a span id from the same generator, the flags the SDK would set) is made only when
  something asks for it — a handler's own span looking for its parent, a propagator, a JSON
  log line. Made current around the handler, it parents the handler's spans as the SDK's
  non-recording span did, so under a parent-based sampler they are dropped with it;
- sampled: the SDK's ``start_span`` makes the span, seeing the same tracer (sampler,
  processors, limits, resource) through ``_Via``, whose id generator hands it the trace id
  already drawn: the SDK decides again, the same way, and records exactly the span it would
  have recorded had it drawn that id itself. Trace ids are drawn in the SDK's order, one per
  root span, so a seeded generator gives the same trace ids and decisions either way; a
  dropped span draws its span id only if its context is ever asked for.

Any other sampler (a custom one, rule-based, or one that may decide RECORD_ONLY), an SDK
whose internal span metrics are on (they count dropped spans too), a tracer disabled by a
tracer configurator, or a tracer that is not the SDK's: ``for_tracer`` returns None and the
SDK decides every span, as before. Private attributes of the SDK are read defensively: when
one is missing, the fast path is simply not used.
"""

from __future__ import annotations

import random
import threading
from functools import partial
from typing import Any

LIMIT = (1 << 64) - 1  # TraceIdRatioBased.TRACE_ID_LIMIT: the bits of a trace id it reads


def root_bound(sampler: Any) -> int | None:
    """The bound under which a root span's trace id (its low 64 bits) is sampled by
    ``sampler``, for the SDK's samplers that decide a root on the trace id alone; None for
    any other sampler (it must be asked for every span)."""
    from opentelemetry.sdk.trace import sampling

    if type(sampler) in (sampling.ParentBased, sampling.ParentBasedTraceIdRatio):
        sampler = getattr(sampler, "_root", None)  # a span with no parent asks its root
    if type(sampler) is sampling.TraceIdRatioBased:
        return sampler.bound
    if type(sampler) is sampling.StaticSampler:
        decision = getattr(sampler, "_decision", None)
        if decision is sampling.Decision.DROP:
            return 0
        if decision is sampling.Decision.RECORD_AND_SAMPLE:
            return LIMIT + 1
    return None


def drops_unsampled_remote_parent(sampler: Any) -> bool:
    """True when ``sampler`` (one of the SDK's) drops every span whose remote parent is not
    sampled: ``ParentBased`` (``ParentBasedTraceIdRatio`` included) with its default
    ``remote_parent_not_sampled`` (``ALWAYS_OFF``). Then a job marked as sent unsampled
    (``tracing.marked``) has its attempt dropped, as if its producer's context were carried."""
    from opentelemetry.sdk.trace import sampling

    if type(sampler) not in (sampling.ParentBased, sampling.ParentBasedTraceIdRatio):
        return False
    remote = getattr(sampler, "_remote_parent_not_sampled", None)
    return (type(remote) is sampling.StaticSampler
            and getattr(remote, "_decision", None) is sampling.Decision.DROP)  # fmt: skip


def for_tracer(tracer: Any, trace: Any) -> Fast | None:
    """The fast path of an SDK ``tracer`` (``trace``: the ``opentelemetry.trace`` module), or
    None when the SDK must decide every span (see the module's docstring)."""
    try:
        from opentelemetry.sdk.trace import Tracer
    except ImportError:  # the API with another implementation
        return None
    if type(tracer) is not Tracer or not callable(getattr(tracer, "_is_enabled", None)):
        return None
    metrics = getattr(tracer, "_tracer_metrics", None)
    if metrics is not None and type(metrics).__name__ != "NoOpTracerMetrics":
        return None
    bound = root_bound(tracer.sampler)
    if bound is None or bound > LIMIT:  # every root sampled: nothing to save
        return None
    return Fast(tracer, bound, trace)


class Fast:
    """One tracer's fast path. ``decide()`` takes a root span's sampling decision: an
    ``Unsampled`` span when dropped, else None, and then the next ``sdk(...)`` call in this
    thread makes the SDK's span with the trace id decided on. ``start`` is the two in one."""

    def __init__(self, tracer: Any, bound: int, trace: Any) -> None:
        ids = tracer.id_generator
        flags = 0
        if ids.is_trace_id_random():  # what the SDK sets (W3C trace context level 2)
            flags |= getattr(trace.TraceFlags, "RANDOM_TRACE_ID", 0)
        handoff = Handoff(ids)
        unsampled = unsampled_class(trace, ids.generate_span_id, trace.TraceFlags(flags))
        self.decide, self.sdk = _closures(tracer, bound, unsampled, _Via(tracer, handoff),
                                          handoff.local)  # fmt: skip
        # The pieces of ``decide`` for a loop over a claim batch (``tracing.start_consumers``),
        # which binds them once instead of calling ``decide`` per attempt.
        self.bound, self.unsampled, self.enabled = bound, unsampled, tracer._is_enabled
        # Whether a job marked as sent unsampled is dropped (a ``marked()`` span, no draw).
        self.drops_marked = drops_unsampled_remote_parent(tracer.sampler)
        self.marked = marked_class(unsampled, trace, ids.generate_trace_id, ids.generate_span_id,
                                   trace.TraceFlags(flags))  # fmt: skip
        self.draw, self.redraw = _drawer(ids)
        self._local = handoff.local

    def sampled(self, trace_id: int, name: str, kind: Any, attributes: Any, links: Any,
                context: Any) -> Any:  # fmt: skip
        """The SDK's span for a root whose ``trace_id`` was drawn and found sampled (what
        ``decide()`` then ``sdk(...)`` do, for a caller that drew the id itself)."""
        self._local.trace_id = trace_id
        return self.sdk(name, kind, attributes, links, context)

    def start(self, name: str, kind: Any, attributes: Any, links: Any, context: Any) -> Any:
        """A root span named ``name``: ``Unsampled`` when the sampler drops it, else the
        SDK's span for the same trace id. ``context`` holds no span (None: the current one
        holds none); the SDK's span processors get it, as ``start_span`` would give it."""
        span = self.decide()
        if span is None:
            span = self.sdk(name, kind, attributes, links, context)
        return span


def _closures(tracer: Any, bound: int, unsampled: type, via: _Via,
              handoff: threading.local) -> tuple[Any, Any]:  # fmt: skip
    """``Fast.decide`` and ``Fast.sdk``: closures, as they run per attempt."""
    draw, redraw = _drawer(tracer.id_generator)
    enabled = tracer._is_enabled
    sdk_start = type(tracer).start_span

    def decide() -> Any:
        trace_id = draw() or redraw()
        if trace_id & LIMIT >= bound and enabled():
            return unsampled(trace_id)
        handoff.trace_id = trace_id
        return None

    def sdk(name: str, kind: Any, attributes: Any, links: Any, context: Any) -> Any:
        try:
            return sdk_start(via, name, context=context, kind=kind, attributes=attributes,
                             links=links)  # fmt: skip
        finally:
            handoff.trace_id = None

    return decide, sdk


def _drawer(ids: Any) -> tuple[Any, Any]:
    """``(draw, redraw)``: ``draw()`` is the generator's next trace id or 0, ``redraw()`` what
    replaces a 0. For the SDK's ``RandomIdGenerator``, ``draw`` is ``random.getrandbits(128)``
    without the generator's Python frame and ``redraw`` the generator (it draws until the id is
    not 0): the same draws from the same stream. Any other generator is called as it is, and
    its 0 kept (``redraw`` returns it), as the SDK would keep it."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    if type(ids) is RandomIdGenerator and "generate_trace_id" not in vars(ids):
        return partial(random.getrandbits, 128), ids.generate_trace_id
    return ids.generate_trace_id, int


class Handoff:
    """An id generator that gives the SDK the trace id ``Fast.start`` drew (once, in this
    thread), and otherwise asks the provider's own generator."""

    def __init__(self, ids: Any) -> None:
        self.ids = ids
        self.local = threading.local()

    def generate_trace_id(self) -> int:
        trace_id = getattr(self.local, "trace_id", None)
        if trace_id is None:
            return self.ids.generate_trace_id()
        self.local.trace_id = None
        return trace_id

    def generate_span_id(self) -> int:
        return self.ids.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self.ids.is_trace_id_random()


class _Via:
    """The SDK tracer with ``Handoff`` as its id generator, for the SDK's ``start_span`` to
    run on: every other attribute is the tracer's own, read at each call (so a processor added
    later, or a new tracer configuration, is seen), and the tracer itself is not modified."""

    def __init__(self, tracer: Any, ids: Handoff) -> None:
        self._jobq_tracer = tracer
        self.id_generator = ids

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jobq_tracer, name)


def unsampled_class(trace: Any, span_id_of: Any, flags: Any) -> type:
    """``Unsampled`` for one id generator (``span_id_of``) and its trace ``flags``, over
    ``trace`` (``opentelemetry.trace``, imported by the caller: the API is optional)."""

    class Unsampled(trace.NonRecordingSpan):
        """A dropped root span; its span id and ``SpanContext`` are made when first asked
        for (most dropped attempts are never asked)."""

        def __init__(self, trace_id: int) -> None:
            self._trace_id = trace_id

        def get_span_context(self) -> Any:
            context = self.__dict__.get("_context")
            if context is None:
                context = trace.SpanContext(self._trace_id, span_id_of(), is_remote=False,
                                            trace_flags=flags)  # fmt: skip
                # Two threads racing here: both return the first one stored (setdefault is
                # atomic), so a span never shows two span ids.
                context = self.__dict__.setdefault("_context", context)
            return context

        def __repr__(self) -> str:
            return f"{type(self).__name__}({self.get_span_context()!r})"

    return Unsampled


def marked_class(unsampled: type, trace: Any, trace_id_of: Any, span_id_of: Any,
                 flags: Any) -> type:  # fmt: skip
    """``Marked``: the dropped attempt of a job sent unsampled (``tracing.marked``), an
    ``Unsampled`` whose trace id too is drawn (``trace_id_of``) only when its context is first
    asked for: no decision needs it. Made with no Python ``__init__``: ``Marked()``."""

    class Marked(unsampled):  # type: ignore[valid-type,misc]
        __init__ = object.__init__  # the C slot: no frame per attempt

        def get_span_context(self) -> Any:
            context = self.__dict__.get("_context")
            if context is None:
                context = trace.SpanContext(trace_id_of(), span_id_of(), is_remote=False,
                                            trace_flags=flags)  # fmt: skip
                context = self.__dict__.setdefault("_context", context)  # as Unsampled's
            return context

    return Marked
