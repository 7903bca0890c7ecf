"""Running jobs: the worker (``core.py``: claim loop, acker, heartbeat), one job's run and its
verdict (``execution.py``), the pools handlers run in (``pools/``), failure handlers
(``failures.py``), the reaper (``reaper.py``), the serving lifecycle shared with the subscriber
worker (``lifecycle.py``), dynamic concurrency (``autoscale.py``), the pre-fork launcher
(``prefork.py``) and stop signals (``stopsignals.py``)."""

from .core import Worker

__all__ = ["Worker"]
