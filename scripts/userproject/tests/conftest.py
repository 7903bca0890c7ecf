import pytest

from shop import jobs, services


@pytest.fixture(autouse=True)
def _fresh_example_state():
    services.SENT.clear()
    services.ALERTS.clear()
    jobs.FLAKY_SMTP["failures_left"] = 0
