"""OpenTelemetry tracing in-process, on every backend: producer and consumer spans, the trace
context carried in the envelope, errors recorded; plain jobs stay plain without a provider."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_jobq import JobFailed
from django_jobq.observability import tracing
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    spans.provider = provider  # type: ignore[attr-defined]
    yield spans
    tracing.use_provider(None)
    provider.shutdown()


@pytest.fixture
def handlers(exporter) -> HandlerRegistry:
    registry = HandlerRegistry()
    tracer = exporter.provider.get_tracer("tests")

    def run(job):
        with tracer.start_as_current_span("inside the handler"):
            if job.payload.get("fail"):
                raise ValueError(f"boom {job.attempt}")
            return job.payload

    registry.register("traced", run)
    return registry


@pytest.fixture
def worker(live_storage, handlers):
    w = Worker(["traced"], storage=live_storage, handlers=handlers, lease=5000, grace=1,
               worker_id="trace-worker")  # fmt: skip
    w.start()
    yield w
    w.stop(hurry=True)
    assert w.stopped.wait(20)


def spans_named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_consumer_span_is_the_child_of_the_enqueue_span(live_storage, exporter, worker):
    q = Queue("traced", storage=live_storage)
    assert q.enqueue_and_wait("t1", {"x": 1}, timeout=20) == {"x": 1}
    assert wait_until(lambda: spans_named(exporter, "process traced"), 10)
    (producer,) = spans_named(exporter, "send traced")
    (consumer,) = spans_named(exporter, "process traced")
    assert producer.kind is SpanKind.PRODUCER and consumer.kind is SpanKind.CONSUMER
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert producer.attributes["messaging.destination.name"] == "traced"
    assert producer.attributes["messaging.message.id"] == "t1"
    assert dict(consumer.attributes).items() >= {
        "messaging.system": "django_jobq", "messaging.operation.type": "process",
        "messaging.destination.name": "traced", "messaging.message.id": "t1",
        "jobq.attempt": 1, "jobq.worker_id": "trace-worker", "jobq.outcome": "completed",
    }.items()  # fmt: skip
    (inner,) = spans_named(exporter, "inside the handler")  # the handler's own span nests
    assert inner.parent.span_id == consumer.context.span_id


def test_each_attempt_gets_a_span_and_failures_are_recorded(live_storage, exporter, worker):
    q = Queue("traced", storage=live_storage)
    with pytest.raises(JobFailed):
        q.enqueue_and_wait("t2", {"fail": True}, max_attempts=2, min_backoff=10,
                           max_backoff=10, timeout=20)  # fmt: skip
    assert wait_until(lambda: len(spans_named(exporter, "process traced")) == 2, 10)
    (producer,) = spans_named(exporter, "send traced")
    attempts = sorted(spans_named(exporter, "process traced"),
                      key=lambda s: s.attributes["jobq.attempt"])  # fmt: skip
    assert [s.attributes["jobq.outcome"] for s in attempts] == ["retrying", "failed"]
    for span in attempts:
        assert span.parent.span_id == producer.context.span_id
        assert span.status.status_code is StatusCode.ERROR
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "builtins.ValueError"
    assert attempts[1].events[0].attributes["exception.message"] == "boom 2"


def test_enqueue_many_is_one_span_whose_context_every_job_carries(live_storage, exporter,
                                                                   worker):  # fmt: skip
    q = Queue("traced", storage=live_storage)
    q.enqueue_many([("m1", {}), {"id": "m2", "payload": {}, "priority": 1}])
    assert wait_until(lambda: len(spans_named(exporter, "process traced")) == 2, 10)
    (producer,) = spans_named(exporter, "send traced")
    assert producer.attributes["messaging.batch.message_count"] == 2
    for span in spans_named(exporter, "process traced"):
        assert span.parent.span_id == producer.context.span_id


def test_without_a_tracer_provider_jobs_stay_plain(live_storage):
    assert not tracing.active()
    q = Queue("traced", storage=live_storage)
    q.enqueue("plain", {"a": 1})
    assert live_storage.get_record("traced", "plain").content_type == "json"


def test_an_sdk_provider_without_a_span_processor_costs_nothing(live_storage):
    """Installed but exporting nowhere: no span is made, jobs stay plain; once a processor is
    added, tracing starts (checked per call, not cached at start-up)."""
    provider = TracerProvider()
    tracing.use_provider(provider)
    try:
        assert not tracing.active()
        q = Queue("traced", storage=live_storage)
        q.enqueue("unexported", {"a": 1})
        assert live_storage.get_record("traced", "unexported").content_type == "json"
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        assert tracing.active()
        q.enqueue("exported", {"a": 1})
        assert live_storage.get_record("traced", "exported").content_type == "json+env"
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def test_with_a_provider_the_context_travels_in_the_envelope(live_storage, exporter):
    q = Queue("traced", storage=live_storage)
    q.enqueue("carried", {"a": 1})
    record = live_storage.get_record("traced", "carried")
    assert record.content_type == "json+env"
    assert q.get_payload("carried") == {"a": 1}  # the user's payload is unchanged
