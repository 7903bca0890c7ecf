"""JSON log lines: in-process formatting, and a real ``runworker --log-format json`` whose lines
about a job carry its id, queue, attempt, worker and (traced) trace id."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_jobq import JobFailed
from django_jobq.observability import logs as logjson
from django_jobq.observability import tracing
from django_jobq.observability.logs import JsonFormatter, job_context
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until


@pytest.fixture(autouse=True)
def _plain_text_after(monkeypatch):
    """A JsonFormatter switches job context on for the process: off again after each test."""
    monkeypatch.setattr(logjson, "ENABLED", logjson.ENABLED)


def record(message: str, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("inner")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("django_jobq.worker", logging.WARNING, __file__, 1, message, (),
                             info)  # fmt: skip


def test_a_line_outside_a_job_has_no_job_fields():
    line = json.loads(JsonFormatter().format(record("worker %s serving")))
    assert (line["level"], line["logger"], line["message"]) == (
        "WARNING",
        "django_jobq.worker",
        "worker %s serving",
    )
    assert "job_id" not in line and "trace_id" not in line


def test_a_line_inside_a_job_names_it_and_keeps_the_traceback():
    with job_context("emails", "welcome-42", 2, "w-1"):
        line = json.loads(JsonFormatter().format(record("sending", exc=True)))
    assert {k: line[k] for k in ("job_id", "queue", "attempt", "worker")} == {
        "job_id": "welcome-42",
        "queue": "emails",
        "attempt": 2,
        "worker": "w-1",
    }
    assert "ValueError: inner" in line["exception"]


@pytest.mark.redis
@pytest.mark.slow
def test_runworker_json_lines_carry_the_job_and_its_trace(redis_client, redis_prefix, tmp_path):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_OTEL_LOG": str(tmp_path / "spans.jsonl")})  # fmt: skip
    fail = Queue("tests-fail", storage=RedisStorage(redis_client, prefix=redis_prefix))
    try:
        worker = spawn("runworker", "tests-fail", "--worker-id", "json-worker",
                       "--log-format", "json", log="worker")  # fmt: skip
        with pytest.raises(JobFailed):
            fail.enqueue_and_wait("jf1", {}, max_attempts=2, min_backoff=10, max_backoff=10,
                                  timeout=30)  # fmt: skip
        log = Path(worker.log_path)
        assert wait_until(lambda: "attempt 2/2 failed" in log.read_text(), 20), log.read_text()
    finally:
        spawn.stop_all()
        tracing.use_provider(None)
    lines = [json.loads(text) for text in log.read_text().splitlines() if text.startswith("{")]
    assert lines and all("message" in line for line in lines)
    about = [line for line in lines if "attempt 1/2 failed" in line["message"]]
    assert len(about) == 1
    assert {k: about[0][k] for k in ("job_id", "queue", "attempt", "worker")} == {
        "job_id": "jf1",
        "queue": "tests-fail",
        "attempt": 1,
        "worker": "json-worker",
    }
    (producer,) = [s for s in spans.get_finished_spans() if s.name == "send tests-fail"]
    assert about[0]["trace_id"] == f"{producer.context.trace_id:032x}"
    serving = [line for line in lines if "serving" in line["message"]]
    assert serving and "job_id" not in serving[0]
