"""Tracing under a sampler that drops most traces (``django_jobq/fastpath.py``): what is
recorded is exactly what the OpenTelemetry SDK alone records, with the real SDK and its
in-memory exporter; unsampled attempts still parent their handler's spans and children."""

from __future__ import annotations

import random
import threading
from itertools import count
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind

from django_jobq import JobState
from django_jobq.observability import fastpath, tracing
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

RATES = [0.0, 0.25, 0.5, 0.75, 1.0]


class SeededIds(IdGenerator):
    """The SDK's random ids from seeded generators (thread-safe), so two providers built with
    the same seed draw the same ids. Trace ids and span ids come from two streams: a dropped
    span draws its span id only when its context is asked for, so the draws interleave
    differently from the SDK's, while each stream's order is the same."""

    def __init__(self, seed: int) -> None:
        self._traces, self._spans = random.Random(seed), random.Random(seed + 1)
        self._lock = threading.Lock()

    def generate_span_id(self) -> int:
        with self._lock:
            return self._spans.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        with self._lock:
            return self._traces.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True


def provider(sampler, seed: int) -> tuple[TracerProvider, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    made = TracerProvider(sampler=sampler, id_generator=SeededIds(seed))
    made.add_span_processor(SimpleSpanProcessor(spans))
    return made, spans


def decided(span) -> tuple:
    context = span.get_span_context()
    return (context.trace_id, context.span_id, int(context.trace_flags), span.is_recording())


@pytest.fixture(autouse=True)
def no_provider_left():
    yield
    tracing.use_provider(None)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), rate=st.sampled_from(RATES),
       roots=st.lists(st.sampled_from(["consumer", "producer"]), min_size=1,
                      max_size=40))  # fmt: skip
def test_root_spans_are_decided_and_identified_exactly_as_by_the_sdk(seed, rate, roots):
    """Same seed, same sampler: django_jobq's spans (fast path or not) and the SDK's own
    ``start_span`` draw the same ids, take the same decisions, and export the same spans."""
    ours, ours_spans = provider(ParentBased(TraceIdRatioBased(rate)), seed)
    sdk, sdk_spans = provider(ParentBased(TraceIdRatioBased(rate)), seed)
    tracing.use_provider(ours)
    assert tracing.active()
    assert (tracing._fast() is None) == (rate == 1.0)  # every root sampled: nothing to save
    sdk_tracer = sdk.get_tracer("sdk")
    got, expected = [], []
    for kind in roots:
        if kind == "consumer":
            span = tracing.start_consumer("q", "j", 1, "w", {})
            tracing.end_consumer(span, "completed", None)
            got.append(decided(span))
            reference = sdk_tracer.start_span("process q", context=Context(),
                                              kind=SpanKind.CONSUMER)  # fmt: skip
            reference.end()
            expected.append(decided(reference))
        else:
            with tracing.producer_span("q") as (span, carrier):
                got.append((*decided(span), bool(carrier)))
            with sdk_tracer.start_as_current_span("send q", kind=SpanKind.PRODUCER) as ref:
                expected.append((*decided(ref), ref.get_span_context().trace_flags.sampled))
    assert got == expected
    assert [s.context.span_id for s in ours_spans.get_finished_spans()] == [
        s.context.span_id for s in sdk_spans.get_finished_spans()
    ]
    for span in ours_spans.get_finished_spans():  # the sampler's own rule, on a root
        assert span.parent is None
        assert span.context.trace_id & fastpath.LIMIT < TraceIdRatioBased(rate).bound


@pytest.mark.parametrize(
    ("sampler", "fast"),
    [
        (ParentBased(TraceIdRatioBased(0.01)), True),
        (ParentBasedTraceIdRatio(0.01), True),
        (TraceIdRatioBased(0.01), True),
        (ParentBased(ALWAYS_OFF), True),
        (ALWAYS_OFF, True),
        (DEFAULT_ON, False),  # every root is sampled: the SDK makes every span anyway
        (ALWAYS_ON, False),
        (StaticSampler(Decision.RECORD_ONLY), False),  # records what it does not sample
        (ParentBased(StaticSampler(Decision.RECORD_ONLY)), False),
    ],
)
def test_the_fast_path_is_taken_only_for_samplers_that_decide_a_root_by_its_trace_id(sampler, fast):
    made, _ = provider(sampler, 1)
    tracing.use_provider(made)
    assert (tracing._fast() is not None) is fast


def test_a_custom_sampler_decides_every_span_itself():
    """A sampler django_jobq does not know may look at anything (name, attributes, its own
    state): it is asked for every span, exactly as the SDK asks it."""
    asked = []

    class EveryOther(TraceIdRatioBased):
        def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
            asked.append(name)
            rate = 1.0 if len(asked) % 2 else 0.0
            return TraceIdRatioBased(rate).should_sample(parent_context, trace_id, name)

    made, spans = provider(EveryOther(0.5), 1)
    tracing.use_provider(made)
    assert tracing._fast() is None
    for i in range(4):
        tracing.end_consumer(tracing.start_consumer("q", str(i), 1, "w", {}), "completed", None)
    assert asked == ["process q"] * 4
    assert len(spans.get_finished_spans()) == 2


def test_an_unsampled_span_builds_its_context_only_when_asked_and_always_the_same():
    made, _ = provider(ParentBased(TraceIdRatioBased(0.0)), 7)
    tracing.use_provider(made)
    span = tracing.start_consumer("q", "j", 1, "w", {})
    assert "_context" not in span.__dict__  # nothing asked yet: no span id, no SpanContext
    context = span.get_span_context()
    assert context.is_valid and not context.trace_flags.sampled and not context.is_remote
    assert span.get_span_context() is context
    assert not span.is_recording()


# -- a real worker: every recorded span has the right parent, a dropped root records nothing --

jobs_strategy = st.lists(
    st.fixed_dictionaries({"spawn": st.booleans(), "many": st.booleans(),
                           "request": st.booleans()}),
    min_size=1, max_size=8,
)  # fmt: skip
examples = count()


@pytest.fixture
def traced_handlers(live_storage) -> HandlerRegistry:
    """``sampled``: each attempt opens a span of its own and, asked to, enqueues a child job
    (``kid-<id>``) from inside the handler, under the attempt's span."""
    registry = HandlerRegistry()

    def run(job):
        tracer = tracing._tracer()
        with tracer.start_as_current_span("inside", attributes={"job": job.id}):
            if job.payload.get("spawn"):
                Queue("sampled", storage=live_storage).enqueue(f"kid-{job.id}", {}, max_attempts=1)
        return None

    registry.register("sampled", run)
    return registry


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(seed=st.integers(0, 2**32), rate=st.sampled_from(RATES), jobs=jobs_strategy)
def test_every_recorded_span_has_its_parent_and_a_dropped_root_records_nothing(
    live_storage, traced_handlers, seed, rate, jobs
):
    made, exporter = provider(ParentBased(TraceIdRatioBased(rate)), seed)
    tracing.use_provider(made)
    tag = next(examples)
    q = Queue("sampled", storage=live_storage)
    ids = [f"j{tag}-{i}" for i in range(len(jobs))]
    for job_id, job in zip(ids, jobs, strict=True):
        payload = {"spawn": job["spawn"]}
        if job["request"]:
            with tracing._tracer().start_as_current_span("request"):
                q.enqueue(job_id, payload, max_attempts=1)
        elif job["many"]:
            q.enqueue_many([{"id": job_id, "payload": payload, "max_attempts": 1}])
        else:
            q.enqueue(job_id, payload, max_attempts=1)
    kids = [f"kid-{j}" for j, job in zip(ids, jobs, strict=True) if job["spawn"]]
    worker = Worker(["sampled"], storage=live_storage, handlers=traced_handlers, lease=5000,
                    grace=5, worker_id="sampling-worker", concurrency=4)  # fmt: skip
    worker.start()
    try:
        ended = (JobState.COMPLETED, JobState.FAILED)
        states = lambda: [getattr(q.get_status(j), "state", None) for j in ids + kids]  # noqa: E731
        assert wait_until(lambda: all(s in ended for s in states()), 20)
        assert set(states()) == {JobState.COMPLETED}
    finally:
        worker.stop()
        assert worker.stopped.wait(20)
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:  # no orphan: a recorded span's parent is recorded, in its trace
        if span.parent is not None:
            assert span.parent.span_id in by_id, span.name
            assert by_id[span.parent.span_id].context.trace_id == span.context.trace_id
        else:  # a root, recorded only because its sampler's rule says so
            assert span.context.trace_id & fastpath.LIMIT < TraceIdRatioBased(rate).bound
    sends = {s.attributes["messaging.message.id"]: s for s in spans if s.name == "send sampled"
             and "messaging.message.id" in s.attributes}  # fmt: skip
    batch_sends = [s for s in spans if s.name == "send sampled" and s not in sends.values()]
    attempts = {s.attributes["messaging.message.id"]: s for s in spans
                if s.name == "process sampled"}  # fmt: skip
    inside = {s.attributes["job"]: s for s in spans if s.name == "inside"}
    assert len(attempts) == len(set(attempts))
    for job_id in ids + kids:
        carried = "json+env" == live_storage.get_record("sampled", job_id).content_type
        if carried:  # a sampled send: its attempt is recorded (the parent-based rule)
            assert job_id in attempts
        if job_id in attempts:
            attempt = attempts[job_id]
            send = sends.get(job_id)
            if carried:  # a sampled send: the attempt is its child
                assert send is not None or batch_sends
                parents = [send] if send is not None else batch_sends
                assert attempt.parent.span_id in {p.context.span_id for p in parents}
            else:  # a plain job: the attempt is a root of its own
                assert attempt.parent is None
            assert inside[job_id].parent.span_id == attempt.context.span_id
        else:  # dropped attempt: nothing of its handler recorded, no context carried on
            assert not carried
            assert job_id not in inside
            if f"kid-{job_id}" in kids:
                assert f"kid-{job_id}" not in sends
                assert live_storage.get_record("sampled", f"kid-{job_id}").content_type == "json"
    for kid in kids:  # a child job sent from a recorded attempt is its child
        parent = attempts.get(kid.removeprefix("kid-"))
        if parent is not None:
            assert sends[kid].parent.span_id == inside[kid.removeprefix("kid-")].context.span_id
            assert sends[kid].context.trace_id == parent.context.trace_id


# -- a claim batch at once (tracing.start_consumers), as the worker starts its attempts --------


# How a claimed job came: plain (its send not traced), carrying a sampled send's context, or
# marked as sent unsampled (a plain JSON job: one trailing space; an enveloped one: its meta).
KINDS = ["plain", "carried", "marked", "marked-meta", "plain-meta", "msgpack"]


def claimed(kinds: list[str], carrier: dict) -> tuple[list[SimpleNamespace], list[dict]]:
    jobs, metas = [], []
    for i, kind in enumerate(kinds):
        payload, content_type, meta = b'{"n":1}', "json", {}
        if kind == "marked":
            payload = tracing.mark(payload)
        elif kind == "msgpack":  # never marked; a trailing space is not a mark there
            payload, content_type = b"\x81\xa1n\x01 ", "msgpack"
        elif kind != "plain":  # enveloped: the meta was decoded by the worker
            payload, content_type = b'{"payload":1,"meta":{}}', "json+env"
            meta = {"carried": {tracing.TRACE_META: carrier},
                    "marked-meta": {tracing.UNSAMPLED_META: True, "timeout": 5.0},
                    "plain-meta": {"timeout": 5.0}}[kind]  # fmt: skip
        jobs.append(SimpleNamespace(queue="q", job_id=f"j{i}", attempt=i + 1, payload=payload,
                                    content_type=content_type))  # fmt: skip
        metas.append(meta)
    return jobs, metas


SAMPLERS = {
    "parent-based": lambda rate: ParentBased(TraceIdRatioBased(rate)),
    # A parent-based sampler that samples under an unsampled remote parent: marks ignored.
    "keeps-unsampled-remote": lambda rate: ParentBased(
        TraceIdRatioBased(rate), remote_parent_not_sampled=ALWAYS_ON
    ),
    "bare-ratio": TraceIdRatioBased,  # not parent-based: marks ignored
}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32), rate=st.sampled_from(RATES),
       sampler=st.sampled_from(sorted(SAMPLERS)),
       kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=40))  # fmt: skip
def test_a_claim_batch_gets_the_spans_of_one_attempt_at_a_time(seed, rate, sampler, kinds):
    """``start_consumers`` over a batch (plain jobs, jobs carrying a sampled producer's
    context, jobs marked as sent unsampled, mixed) draws the same ids, takes the same
    decisions and exports the same spans, with the same attributes, as ``start_consumer``
    called for each attempt in turn."""
    one, one_spans = provider(SAMPLERS[sampler](rate), seed)
    many, many_spans = provider(SAMPLERS[sampler](rate), seed)
    carrier = {"traceparent": f"00-{seed + 1:032x}-{seed + 1:016x}-01"}
    jobs, metas = claimed(kinds, carrier)

    def batch(made, start):
        tracing.use_provider(made)
        spans = start()
        for span in spans:
            tracing.end_consumer(span, "completed", None)
        return [decided(span) for span in spans]

    expected = batch(one, lambda: [
        tracing.start_consumer(j.queue, j.job_id, j.attempt, "w", m,
                               tracing.marked(j.content_type, j.payload))
        for j, m in zip(jobs, metas, strict=True)])  # fmt: skip
    got = batch(many, lambda: tracing.start_consumers(jobs, metas, "w"))
    assert got == expected
    if sampler == "parent-based" and rate < 1:  # a marked job's attempt is dropped, whatever
        # its draw (at 1.0 the SDK makes every span: no fast path, marks not read)
        for kind, span in zip(kinds, got, strict=True):
            if kind in ("marked", "marked-meta"):
                assert not span[3] and not span[2] & 1
    exported = lambda spans: [(s.name, s.context.span_id, s.parent, dict(s.attributes))  # noqa: E731
                              for s in spans.get_finished_spans()]  # fmt: skip
    assert exported(many_spans) == exported(one_spans)


def test_the_sdks_random_generator_is_drawn_from_without_its_frame_but_from_its_stream():
    """The batch path draws ``random.getrandbits(128)`` itself for the SDK's
    ``RandomIdGenerator``: the very numbers the generator would have drawn."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    ids = RandomIdGenerator()
    draw, redraw = fastpath._drawer(ids)
    assert redraw == ids.generate_trace_id
    state = random.getstate()
    try:
        random.seed(19)
        theirs = [ids.generate_trace_id() for _ in range(5)]
        random.seed(19)
        ours = [draw() or redraw() for _ in range(5)]
    finally:
        random.setstate(state)
    assert ours == theirs
    assert fastpath._drawer(SeededIds(1))[1]() == 0  # another generator: called, its 0 kept


def test_call_in_makes_the_span_current_for_the_call_only():
    made, _ = provider(ParentBased(TraceIdRatioBased(0.0)), 3)
    tracing.use_provider(made)
    span = tracing.start_consumer("q", "j", 1, "w", {})
    seen = []

    def handler(x):
        seen.append((x, trace.get_current_span()))
        raise KeyError(x)

    with pytest.raises(KeyError):
        tracing.call_in(span, handler, 5)
    assert seen == [(5, span)]
    assert trace.get_current_span() is trace.INVALID_SPAN
    with tracing._tracer().start_as_current_span("outer") as outer:  # something current: kept
        assert tracing.call_in(span, lambda: trace.get_current_span()) is span
        assert trace.get_current_span() is outer


# -- the producer's "not sampled" mark --------------------------------------------------------


@pytest.mark.parametrize(
    ("sampler", "drops"),
    [
        (ParentBased(TraceIdRatioBased(0.01)), True),
        (ParentBasedTraceIdRatio(0.01), True),
        (ParentBased(ALWAYS_OFF), True),
        (ParentBased(TraceIdRatioBased(0.01), remote_parent_not_sampled=ALWAYS_ON), False),
        (TraceIdRatioBased(0.01), False),  # not parent-based: a parent's decision not asked
        (ALWAYS_OFF, False),
    ],
)
def test_a_mark_is_read_only_under_samplers_that_drop_an_unsampled_remote_parent(sampler, drops):
    assert fastpath.drops_unsampled_remote_parent(sampler) is drops


def test_unsampled_sends_mark_their_jobs_and_sampled_ones_carry_their_context(live_storage):
    from django_jobq.queue.flows import enqueue_flow, node

    made, _ = provider(ParentBased(ALWAYS_OFF), 5)
    tracing.use_provider(made)
    plain = Queue("marks", storage=live_storage)
    packed = Queue("marks-mp", storage=live_storage, serde="msgpack")
    plain.enqueue("m1", {"a": 1})
    packed.enqueue("m2", {"a": 1})  # a trailing byte would not decode: left unmarked
    packed.enqueue("m3", {"a": 1}, timeout=9)  # an envelope anyway: the meta says it
    enqueue_flow(node("marks", "fp", {}, children=[node("marks", "fk", {})]),
                 storage=live_storage)  # fmt: skip
    record = lambda q, j: live_storage.get_record(q, j)  # noqa: E731
    assert tracing.marked("json", record("marks", "m1").payload)
    assert plain.serde.loads(record("marks", "m1").payload) == {"a": 1}
    assert record("marks-mp", "m2").payload == packed.serde.dumps({"a": 1})
    assert not tracing.marked("msgpack", record("marks-mp", "m2").payload)
    m3 = packed.serde.loads(record("marks-mp", "m3").payload)["meta"]
    assert m3 == {tracing.UNSAMPLED_META: True, "timeout": 9.0}
    for job_id in ("fp", "fk"):  # a flow's jobs have envelopes (flow, parents)
        meta = plain.serde.loads(record("marks", job_id).payload)["meta"]
        assert meta[tracing.UNSAMPLED_META] is True and tracing.TRACE_META not in meta
    sampling, _ = provider(ParentBased(ALWAYS_ON), 5)
    tracing.use_provider(sampling)
    plain.enqueue("s1", {"a": 1})
    s1 = record("marks", "s1")
    assert s1.content_type == "json+env"
    meta = plain.serde.loads(s1.payload)["meta"]
    assert set(meta) == {tracing.TRACE_META}


def test_a_marked_attempt_draws_its_ids_only_when_asked_and_parents_its_handlers_spans():
    """A job sent unsampled: its attempt is dropped without a draw (the generator's stream
    is untouched until its context is asked for), and made current it still parents the
    handler's spans, which are dropped with it."""
    made, spans = provider(ParentBased(TraceIdRatioBased(1 - 1e-9)), 11)
    tracing.use_provider(made)
    ids = made.id_generator
    before = ids._traces.getstate()
    job = SimpleNamespace(queue="q", job_id="j", attempt=1, payload=tracing.mark(b"{}"),
                          content_type="json")  # fmt: skip
    (span,) = tracing.start_consumers([job], [{}], "w")
    assert not span.is_recording() and ids._traces.getstate() == before
    assert "_context" not in span.__dict__

    def handler():
        with tracing._tracer().start_as_current_span("inside") as inner:
            return inner

    inner = tracing.call_in(span, handler)
    context = span.get_span_context()
    assert context.is_valid and not context.trace_flags.sampled
    assert span.get_span_context() is context
    assert not inner.is_recording()
    assert inner.get_span_context().trace_id == context.trace_id
    tracing.end_consumer(span, "completed", None)
    assert spans.get_finished_spans() == ()
