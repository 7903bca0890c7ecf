"""How a worker runs handlers: ``thread`` (default; I/O-bound handlers), ``process`` (CPU-bound
handlers and hard timeouts: a fixed set of reused child processes) or ``async`` (``async def``
handlers, many jobs in flight on one event loop).

Every runner turns a claimed job into a verdict (an ``Ack``) with the same rules
(``execution.py``); they differ only in where the handler runs and what can stop it.
"""

from __future__ import annotations

from .aio import AsyncRunner
from .process import ProcessRunner
from .thread import ThreadRunner
from .watchdog import Watchdog

POOLS = ("thread", "process", "async")

__all__ = ["POOLS", "AsyncRunner", "ProcessRunner", "ThreadRunner", "Watchdog"]
