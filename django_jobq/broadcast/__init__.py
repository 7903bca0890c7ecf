"""Broadcasts: a message published once is handled once by every subscriber group
(``core.py``: ``Broadcast`` and ``@subscriber``; ``subscribers.py``: the loop that runs them in
``runworker``). Each backend's broadcast store lives in its own folder under ``storage/``."""

from .core import Broadcast, Subscription, subscriber

__all__ = ["Broadcast", "Subscription", "subscriber"]
