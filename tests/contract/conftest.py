"""Fixtures of the contract suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def wakeups_only(monkeypatch):
    """Lift the storages' safety-net re-reads (Redis blocks at most ``MAX_BLOCK_SECONDS`` per
    call, the database backend re-reads every ``RECHECK`` s) above any wait of the test, so a
    wait that returns early can only have been woken by its signal: wake-up tests then decide
    on that event with a generous bound, not on a bound below the safety net's period."""
    monkeypatch.setattr("django_jobq.storage.redis.storage.MAX_BLOCK_SECONDS", 300.0)
    monkeypatch.setattr("django_jobq.storage.database.wakeups.RECHECK", 300.0)


# A wait a signal should end; with ``wakeups_only`` only a missing signal lets it run this long.
LONG_WAIT = 120.0
