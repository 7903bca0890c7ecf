"""Settings of the fault tests' worker processes: the test settings, this package's handlers,
and the storage class chosen by the test (``JOBQ_CHAOS_BACKEND``: the crash-injecting one of
faults.py, or plain Redis)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, JOBQ

INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos"]
JOBQ = {**JOBQ, "BACKEND": os.environ.get("JOBQ_CHAOS_BACKEND", "redis")}
