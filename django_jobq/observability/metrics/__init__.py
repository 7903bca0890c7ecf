"""Prometheus metrics of django-jobq (optional extra ``metrics``: ``prometheus_client``).

Two kinds, kept apart because they live in different places:

- **Process counters and a run-time histogram** (``tally.py``), counted in the process where
  each step happens: a web process counts what it enqueued, a worker what it ran. ``install()``
  starts them; ``runworker --metrics-port`` does it for its worker, and
  ``JOBQ["METRICS"]["ENABLED"]`` does it in every process at start-up.
- **Storage gauges** (``collectors.py``), read from the storage when scraped (depth by state,
  latency, dead letters, failure-call backlog, mirror lag, live workers): shared state, served by
  the Django view, so every worker need not ask storage the same questions.

Labels are bounded: queue, handler (one per queue), state or outcome; never a job id.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError


def prometheus() -> Any:
    """The ``prometheus_client`` module, or a clear error naming the extra to install."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "django_jobq metrics need prometheus_client: pip install 'django-jobq[metrics]'"
        ) from exc
    return prometheus_client


def install() -> Any:
    """Count this process's jobs from now on (idempotent); returns the process ``Tally``."""
    from .tally import install as install_tally

    return install_tally()
