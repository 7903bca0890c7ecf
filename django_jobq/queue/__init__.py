"""The Queue API: what producers and operators call (``core.py``), a queue stored as several
partitions (``sharded.py``, ``sharding.py``, ``sharded_events.py``), job flows (``flows.py``),
journal mode (``journal.py``) and the public event feed (``events.py``)."""

from .core import Queue, get_queue
from .sharded import ShardedQueue

__all__ = ["Queue", "ShardedQueue", "get_queue"]
