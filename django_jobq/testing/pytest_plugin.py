"""The ``jobq`` pytest fixture (registered through the ``pytest11`` entry point).

It is loaded in every pytest session of an environment where django-jobq is installed, before
Django is set up: importing it reads no setting and loads no app (the test mode itself is
imported when a test asks for the fixture), and it changes nothing for tests that do not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .mode import JobQTestMode

# pytest-django's fixtures that give a test database access.
_DB_FIXTURES = (
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
)


def _has_database(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in _DB_FIXTURES
    )


@pytest.fixture
def jobq(request: pytest.FixtureRequest) -> Iterator[JobQTestMode]:
    """The test mode for this test: ``jobq.enqueued("emails")``, ``jobq.run_all()``, ...

    Schedules fire in ``run_all()`` when the test has database access (the ``django_db``
    mark or the ``db`` fixture): ``Schedule`` rows live in the database."""
    from .mode import jobq_test_mode

    with jobq_test_mode(schedules=_has_database(request)) as mode:
        yield mode
