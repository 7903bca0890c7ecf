"""The model mirror of the Redis backend: event streams to ``Job`` / ``JobEvent`` /
``WorkerInfo`` rows (``core.py``), its SQL (``sql.py``), how it sheds load on a queue it fell
behind on (``sample.py``), how far it is from Redis (``check.py``) and the per-minute rollup
the admin's charts read (``rollup.py``)."""

from .core import Mirror

__all__ = ["Mirror"]
