"""A module whose import has an effect: a message naming it must never make a worker import
it (tests/test_tasks_backend.py)."""

import os

os.environ["JOBQ_TEST_SIDE_EFFECT_IMPORTED"] = "1"


def s() -> None:
    raise AssertionError("never called")
