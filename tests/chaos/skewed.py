"""Runs ``manage.py`` with a wall clock ``JOBQ_CHAOS_SKEW`` seconds off (fault 8).

The injected clock shifts ``time.time`` and ``time.time_ns``, the wall clock the worker's and
its handlers' Python code reads for timestamps (``datetime.now`` reads the C clock and is not
shifted); monotonic clocks stay true, as they do on a host whose wall clock drifted. Used as
a Supervisor launcher: ``[python, tests/chaos/skewed.py]``."""

import os
import runpy
import sys
import time
from pathlib import Path

MANAGE = str(Path(__file__).resolve().parents[2] / "manage.py")
_skew = float(os.environ["JOBQ_CHAOS_SKEW"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _skew
time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
sys.argv = [MANAGE, *sys.argv[1:]]
runpy.run_path(MANAGE, run_name="__main__")
