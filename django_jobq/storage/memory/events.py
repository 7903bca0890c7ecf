"""The event log: each queue's last events in a bounded deque, appended in the step of the change
they tell of (``MemoryCore._event``); ids ``<ms>-<seq>`` order as Redis stream ids do."""

from __future__ import annotations

import time

from ...errors import EventsLost
from ...job import Event
from .core import MemoryCore, _event_key


class Events(MemoryCore):
    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        return self.read_events_many({queue: after}, count, block)[queue]

    def read_events_many(
        self, after: dict[str, str], count: int = 1000, block: float | None = None
    ) -> dict[str, list[Event]]:
        """One wait over every queue: each change notifies the storage's one condition."""
        floors = {queue: _event_key(position) for queue, position in after.items()}
        deadline = time.monotonic() + (block or 0)
        with self._cond:
            for queue, floor in floors.items():
                if floor > (0, 0) and self._peek(queue).events_gone > floor:
                    raise EventsLost(queue, after[queue])
            while True:
                out = {
                    queue: [e for e in self._peek(queue).events if _event_key(e.id) > floor][:count]
                    for queue, floor in floors.items()
                }
                remaining = deadline - time.monotonic()
                if any(out.values()) or not block or remaining <= 0:
                    return out
                self._cond.wait(remaining)
