"""The event log: one row per transition of a job, appended in the transition's own transaction
(so a reader never sees an event of a change that rolled back), read in id order."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...errors import EventsLost
from ...job import Event
from .core import _chunks, _ms, _public_id
from .wakeups import Wakeups


class Events(Wakeups):
    """Appending and reading job events."""

    def _events(self, rows: Sequence[tuple[int, str, str]], kind: str, now: int, worker="") -> None:
        """Append one event per (pk, queue, job_id) in this transaction (one statement)."""
        if not rows:
            return
        at = self._param_dt(now)
        table = self._event_table
        for chunk in _chunks(rows):
            values = ", ".join(["(%s, %s, %s, %s, %s, '')"] * len(chunk))
            params: list[Any] = []
            for pk, q, _ in chunk:
                params += [pk, q, kind, at, worker or ""]
            self._sql(
                f"INSERT INTO {table} (job_id, queue, kind, at, worker, stream_id) VALUES {values}",
                params,
                fetch=False,
            )

    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        return self.read_events_many({queue: after}, count, block)[queue]

    def read_events_many(
        self, after: dict[str, str], count: int = 1000, block: float | None = None
    ) -> dict[str, list[Event]]:
        """One indexed read per queue; the wait is the storage's one wake-up signal, which
        any queue's commit sends (PostgreSQL: from any process)."""
        deadline = time.monotonic() + (block or 0)
        while True:
            since = self._snapshot()
            out = self._kept_events(after, count)
            if any(out.values()) or not block or time.monotonic() >= deadline:
                return out
            self._wait(deadline - time.monotonic(), since)

    def _kept_events(self, after: dict[str, str], count: int) -> dict[str, list[Event]]:
        """The pages after each position, with the check that nothing after it was deleted
        (``EventFloor``, raised in the deleting transaction): the floors are read before and
        after the pages, and the read is made again when a delete landed in between (rare:
        retention passes), so a gap is never read past and never reported falsely."""
        watched = [q for q, position in after.items() if _floor(position) > 0]
        while True:
            floors = self._floors(watched)
            for queue in watched:
                if floors.get(queue, 0) > _floor(after[queue]):
                    raise EventsLost(queue, after[queue])
            out = {queue: self._events_after(queue, position, count)
                   for queue, position in after.items()}  # fmt: skip
            if not watched or self._floors(watched) == floors:
                return out

    def _floors(self, queues: list[str]) -> dict[str, int]:
        if not queues:
            return {}
        rows = self.EventFloor.objects.using(self.using).filter(queue__in=queues)
        return dict(rows.values_list("queue", "gone"))

    def _events_after(self, queue: str, after: str, count: int) -> list[Event]:
        floor = _floor(after)
        rows = (
            self.JobEvent.objects.using(self.using).filter(queue=queue, id__gt=floor)
            .order_by("id").values("id", "job__job_id", "kind", "at", "worker")[:count]
        )  # fmt: skip
        return [
            Event(str(r["id"]), queue, _public_id(r["job__job_id"]), r["kind"], _ms(r["at"]),
                  r["worker"] or None)
            for r in rows
        ]  # fmt: skip


def _floor(position: str) -> int:
    """A position of the database feed as its row id (``"0"``: before every row)."""
    return int(position.split("-")[0] or 0)
