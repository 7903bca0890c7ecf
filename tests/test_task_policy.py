"""Retry policies of task functions, as plain functions: which errors retry, how long each
backoff waits (never negative, never past its cap), and how the worker's verdict uses them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_jobq.errors import ConfigurationError, PermanentError, RateLimited, Retry, RetryDecision
from django_jobq.job import ClaimedJob
from django_jobq.tasks import Backoff, RetryPolicy
from django_jobq.worker.execution import error_verdict

SECONDS = st.floats(min_value=0, max_value=3600, allow_nan=False)
BACKOFFS = st.one_of(
    st.builds(Backoff.fixed, SECONDS, jitter=st.floats(0, 1)),
    st.builds(Backoff.linear, SECONDS, max_delay=SECONDS, jitter=st.floats(0, 1)),
    st.builds(
        Backoff.exponential,
        SECONDS,
        factor=st.floats(1, 100),
        max_delay=SECONDS,
        jitter=st.floats(0, 1),
    ),  # fmt: skip
    st.builds(
        Backoff.custom,
        st.just(lambda n, exc: n * -5.0 if n % 2 else float("inf")),
        max_delay=SECONDS,
    ),  # fmt: skip
)


@given(BACKOFFS, st.integers(min_value=-3, max_value=10_000))
def test_every_backoff_waits_between_zero_and_its_cap(backoff, attempt):
    wait = backoff.seconds(attempt, ValueError())
    assert 0 <= wait <= max(backoff.max_delay, backoff.delay if backoff.kind == "fixed" else 0)


def test_the_backoff_kinds_without_jitter():
    assert [Backoff.fixed(2).seconds(n, ValueError()) for n in (1, 2, 5)] == [2, 2, 2]
    assert [Backoff.linear(2).seconds(n, ValueError()) for n in (1, 2, 5)] == [2, 4, 10]
    exp = Backoff.exponential(1, factor=3, max_delay=20, jitter=0)
    assert [exp.seconds(n, ValueError()) for n in (1, 2, 3, 4)] == [1, 3, 9, 20]
    custom = Backoff.custom(lambda n, exc: 7 if isinstance(exc, KeyError) else 1)
    assert custom.seconds(1, KeyError()) == 7 and custom.seconds(1, ValueError()) == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: Backoff.fixed(-1),
        lambda: Backoff.fixed(float("nan")),
        lambda: Backoff.linear(1, max_delay=10**9),
        lambda: Backoff.exponential(1, factor=0.5),
        lambda: Backoff.fixed(1, jitter=2),
        lambda: Backoff("random"),
        lambda: Backoff("custom"),
    ],
)
def test_a_nonsensical_backoff_is_refused_at_import(make):
    with pytest.raises(ConfigurationError):
        make()


class Transient(Exception):
    pass


def test_which_errors_retry():
    policy = RetryPolicy((Transient, OSError), (ConnectionRefusedError,), Backoff.fixed(3))
    ruled = policy.decide(Transient("x"), 1)
    assert isinstance(ruled, RetryDecision) and not ruled.permanent and ruled.retry_in == 3
    assert policy.decide(ValueError("bug"), 1).permanent  # not listed
    assert policy.decide(ConnectionRefusedError(), 1).permanent  # dont_retry_on wins
    # What the task decided itself is left alone.
    for own in (PermanentError("x"), RateLimited(1), Retry(retry_in=9), KeyboardInterrupt()):
        assert policy.decide(own, 1) is own
    asked = Transient("later")
    asked.retry_in = 60  # the error asks for its own time: the backoff does not override it
    assert policy.decide(asked, 1) is asked


def test_a_broken_custom_backoff_falls_back_to_the_queue_backoff():
    policy = RetryPolicy(backoff=Backoff.custom(lambda n, exc: "soon"))
    error = Transient("x")
    assert policy.decide(error, 1) is error


def claimed(attempt=1):
    return ClaimedJob("q", "j", b"{}", 7, attempt, 5, 1000, 60_000, "json")


def test_the_verdict_records_the_tasks_own_error():
    permanent = error_verdict(claimed(), RetryDecision(KeyError("k"), permanent=True), "[q/j]")
    assert permanent.kind == "fail" and permanent.permanent
    assert b'"type": "builtins.KeyError"' in permanent.body
    retried = error_verdict(claimed(), RetryDecision(KeyError("k"), retry_in=2.5), "[q/j]")
    assert not retried.permanent and retried.retry_in == 2500
    assert b"builtins.KeyError" in retried.body and b"_Delayed" not in retried.body
