"""Execution rules as plain functions: backoff, retry requests, which errors are permanent."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest

from django_jobq.errors import PermanentError, Retry
from django_jobq.job import ClaimedJob
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker.execution import backoff_ms, execute, requested_retry_ms


def claimed(payload: bytes = b"{}", attempt: int = 1, ctype: str = "json") -> ClaimedJob:
    return ClaimedJob("q", "job-1", payload, token=7, attempt=attempt, max_attempts=5,
                      min_backoff=1000, max_backoff=60_000, content_type=ctype)  # fmt: skip


def registry_with(func) -> HandlerRegistry:
    reg = HandlerRegistry()
    reg.register("q", func)
    return reg


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 1000, 1250), (2, 2000, 2500), (3, 4000, 5000), (6, 32_000, 40_000), (7, 60_000, 60_000)],
)
def test_backoff_doubles_per_attempt_with_bounded_jitter_and_a_cap(attempt, low, high):
    rng = random.Random(1)
    delays = [backoff_ms(attempt, 1000, 60_000, rng) for _ in range(200)]
    assert low <= min(delays) and max(delays) <= high
    if low != high:
        assert len(set(delays)) > 50  # jitter actually spreads retries


def test_retry_in_seconds_is_honoured():
    assert requested_retry_ms(Retry(retry_in=2.5)) == 2500


def test_retry_at_datetime_is_honoured():
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=10)
    assert 9_000 <= requested_retry_ms(Retry(retry_at=at)) <= 10_000


def test_any_exception_with_retry_in_attribute_is_honoured():
    exc = ValueError("rate limited")
    exc.retry_in = 30
    assert requested_retry_ms(exc) == 30_000


def test_plain_exception_uses_the_backoff():
    assert requested_retry_ms(ValueError("x")) is None


def test_success_completes_with_the_serialised_result():
    ack = execute(claimed(b'{"a":1}'), registry_with(lambda job: job.payload["a"] + 1))
    assert (ack.kind, ack.token, ack.body) == ("complete", 7, b"2")


def test_handler_error_retries_after_backoff():
    def boom(job):
        raise ValueError("nope")

    ack = execute(claimed(attempt=2), registry_with(boom), rng=random.Random(0))
    assert (ack.kind, ack.permanent) == ("fail", False)
    assert 2000 <= ack.retry_in <= 2500
    error = json.loads(ack.body)
    assert (error["type"], error["message"]) == ("builtins.ValueError", "nope")
    assert "boom" in error["traceback"]


def test_permanent_error_fails_without_retry():
    def perm(job):
        raise PermanentError("bad input")

    ack = execute(claimed(), registry_with(perm))
    assert (ack.kind, ack.permanent) == ("fail", True)


def test_retry_request_overrides_the_backoff():
    def later(job):
        raise Retry(retry_in=0.25)

    assert execute(claimed(), registry_with(later)).retry_in == 250


def test_malformed_payload_fails_permanently_without_calling_the_handler():
    calls = []
    ack = execute(claimed(b"{not json"), registry_with(calls.append))
    assert (ack.kind, ack.permanent, calls) == ("fail", True, [])
    assert json.loads(ack.body)["type"] == "MalformedPayload"


def test_unknown_content_type_fails_permanently():
    ack = execute(claimed(ctype="pickle"), registry_with(lambda job: 1))
    assert (ack.kind, ack.permanent) == ("fail", True)


def test_missing_handler_fails_permanently():
    ack = execute(claimed(), HandlerRegistry())
    assert (ack.kind, ack.permanent, json.loads(ack.body)["type"]) == ("fail", True, "NoHandler")


def test_unserialisable_result_fails_permanently():
    ack = execute(claimed(), registry_with(lambda job: object()))
    assert (ack.kind, ack.permanent, json.loads(ack.body)["type"]) == ("fail", True, "BadResult")


def test_system_exit_in_a_handler_is_a_retryable_failure_not_a_worker_exit():
    def exits(job):
        raise SystemExit(3)

    assert execute(claimed(), registry_with(exits)).kind == "fail"


def test_handler_sees_attempt_and_cancellation_flag():
    seen = {}

    def look(job):
        seen.update(attempt=job.attempt, last=job.is_last_attempt, cancelled=job.is_cancelled())
        return None

    execute(claimed(attempt=5), registry_with(look))
    assert seen == {"attempt": 5, "last": True, "cancelled": False}
