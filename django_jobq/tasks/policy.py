"""Retry policies of task functions: which exceptions retry, and how long to wait before the
next attempt.

Why a policy object instead of options on the queue: the queue's ``min_backoff`` /
``max_backoff`` describe one exponential curve for every job on it, while the tasks sharing a
queue want different things (an HTTP call retries on ``ConnectionError`` with a short fixed
delay; a report never retries a ``ValueError``). The policy runs in the worker, inside the task
runner, and hands the verdict to ``execution.error_verdict`` as a ``RetryDecision``, so the
dead letter still records the task's own exception type and traceback.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, PermanentError, RateLimited, Retry, RetryDecision

logger = logging.getLogger("django_jobq.worker")
MAX_DELAY = 7 * 86400.0  # a week: longer waits are almost certainly a unit mistake (ms for s)
_RNG = random.Random()  # noqa: S311 - jitter, not security


def _seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value > MAX_DELAY:
        raise ConfigurationError(f"{name} must be in [0, {MAX_DELAY:g}] seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait after failed attempt ``n`` (1-based), in seconds.

    ``kind``: "fixed" (``delay`` every time), "linear" (``delay * n``), "exponential"
    (``delay * factor ** (n - 1)``) or "custom" (``func(n, exc)`` returns seconds). The result
    is capped at ``max_delay``; then ``jitter`` (a fraction, 0 to 1) adds up to that share at
    random, still capped, so a burst of failures does not come back at the same instant.
    Build one with ``Backoff.fixed(...)``, ``.linear(...)``, ``.exponential(...)``,
    ``.custom(...)``."""

    kind: str
    delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.0
    func: Callable[[int, BaseException], float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "linear", "exponential", "custom"):
            raise ConfigurationError(f"unknown backoff kind {self.kind!r}")
        _seconds("backoff delay", self.delay)
        _seconds("backoff max_delay", self.max_delay)
        if (
            isinstance(self.factor, bool)
            or not isinstance(self.factor, int | float)
            or not (1 <= self.factor <= 100)
        ):
            raise ConfigurationError(f"backoff factor must be in [1, 100], got {self.factor!r}")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not (0 <= self.jitter <= 1)
        ):
            raise ConfigurationError(f"backoff jitter must be in [0, 1], got {self.jitter!r}")
        if self.kind == "custom" and not callable(self.func):
            raise ConfigurationError("a custom backoff needs a callable func(attempt, exc)")

    @classmethod
    def fixed(cls, delay: float, *, jitter: float = 0.0) -> Backoff:
        return cls("fixed", delay=delay, max_delay=max(delay, 0.0), jitter=jitter)

    @classmethod
    def linear(cls, step: float, *, max_delay: float = 3600.0, jitter: float = 0.0) -> Backoff:
        return cls("linear", delay=step, max_delay=max_delay, jitter=jitter)

    @classmethod
    def exponential(
        cls, base: float, *, factor: float = 2.0, max_delay: float = 3600.0, jitter: float = 0.25
    ) -> Backoff:
        return cls("exponential", delay=base, factor=factor, max_delay=max_delay, jitter=jitter)

    @classmethod
    def custom(
        cls,
        func: Callable[[int, BaseException], float],
        *,
        max_delay: float = 3600.0,
        jitter: float = 0.0,
    ) -> Backoff:
        return cls("custom", func=func, max_delay=max_delay, jitter=jitter)

    def seconds(self, attempt: int, exc: BaseException, rng: random.Random | None = None) -> float:
        """The wait after failed ``attempt``: never negative, never past ``max_delay``."""
        n = max(attempt, 1)
        if self.kind == "fixed":
            base = self.delay
        elif self.kind == "linear":
            base = self.delay * n
        elif self.kind == "exponential":
            try:
                base = self.delay * self.factor ** (n - 1) if self.delay else 0.0
            except OverflowError:  # far past any cap
                base = self.max_delay
        else:
            assert self.func is not None
            value = self.func(n, exc)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"custom backoff returned {value!r}, not a number of seconds")
            base = value if math.isfinite(value) else self.max_delay
        base = min(self.max_delay, max(0.0, float(base)))
        if self.jitter:
            base = min(self.max_delay, base * (1 + self.jitter * (rng or _RNG).random()))
        return base


def backoff_from(value: object) -> Backoff | None:
    """``backoff=`` of ``@task``: None (the queue's exponential ``min_backoff`` /
    ``max_backoff``), a number (fixed seconds), or a ``Backoff``."""
    if value is None or isinstance(value, Backoff):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Backoff.fixed(_seconds("backoff", value))
    raise ConfigurationError(
        f"backoff must be None, a number of seconds or a Backoff, got {value!r}"
    )


def exception_classes(name: str, value: object) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple | list) or not all(
        isinstance(c, type) and issubclass(c, BaseException) for c in value
    ):
        raise ConfigurationError(f"{name} must be a tuple of exception classes, got {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failures of a task retry, and after how long.

    An exception in ``dont_retry_on`` fails the job for good; with ``retry_on`` given, so does
    any exception not in it (Celery's ``autoretry_for`` reversed: the listed ones retry, the
    rest are bugs no retry fixes). ``dont_retry_on`` wins when a class is in both. A retried
    failure waits ``backoff`` (None: the queue's exponential backoff) unless the exception
    asks for a time itself (``retry_in`` / ``retry_at``, as ``Retry`` does)."""

    retry_on: tuple[type[BaseException], ...] = ()
    dont_retry_on: tuple[type[BaseException], ...] = ()
    backoff: Backoff | None = None

    @property
    def is_default(self) -> bool:
        return not self.retry_on and not self.dont_retry_on and self.backoff is None

    def decide(self, exc: BaseException, attempt: int) -> BaseException:
        """What the runner raises for ``exc``: ``exc`` itself when the defaults apply, else a
        ``RetryDecision`` carrying it."""
        if isinstance(exc, PermanentError | RetryDecision | RateLimited | Retry) or not (
            isinstance(exc, Exception)
        ):
            # The task said itself what should happen (or SystemExit & co.: the worker's own
            # handling applies).
            return exc
        if isinstance(exc, self.dont_retry_on) or (
            self.retry_on and not isinstance(exc, self.retry_on)
        ):
            return RetryDecision(exc, permanent=True)
        if self.backoff is None or _asks_for_time(exc):
            return exc
        try:
            wait = self.backoff.seconds(attempt, exc)
        except Exception:  # noqa: BLE001 - a broken custom backoff must not hide the error
            logger.exception("the backoff of a task failed; the queue's backoff applies")
            return exc
        return RetryDecision(exc, retry_in=wait)


def _asks_for_time(exc: BaseException) -> bool:
    return getattr(exc, "retry_in", None) is not None or getattr(exc, "retry_at", None) is not None


def describe(policy: RetryPolicy) -> dict[str, Any]:
    """A JSON-able summary (admin, docs examples)."""
    out: dict[str, Any] = {
        "retry_on": [f"{c.__module__}.{c.__qualname__}" for c in policy.retry_on],
        "dont_retry_on": [f"{c.__module__}.{c.__qualname__}" for c in policy.dont_retry_on],
    }
    if policy.backoff is not None:
        out["backoff"] = policy.backoff.kind
    return out
