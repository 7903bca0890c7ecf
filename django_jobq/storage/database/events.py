"""The event log: one row per transition of a job, appended in the transition's own transaction
(so a reader never sees an event of a change that rolled back), read in id order."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from typing import Any

from ...errors import EventsLost
from ...job import EVENT_DATA_MAX, Event, event_data
from .core import IN_CHUNK, _ms, _public_id
from .wakeups import Wakeups


class Events(Wakeups):
    """Appending and reading job events."""

    def _events(
        self,
        rows: Sequence[tuple[int, str, str]],
        kind: str,
        now: int,
        worker: str = "",
        data: Sequence[tuple[bytes | None, str]] | None = None,
    ) -> None:
        """Append one event per (pk, queue, job_id) in this transaction (one statement);
        ``data``, per row, the (bytes, content type) its event carries (``Event.data``)."""
        if not rows:
            return
        at = self._param_dt(now)
        table = self._event_table
        cast = "::jsonb" if self.vendor == "postgresql" else ""
        mark = (
            f"(%s, %s, %s, %s, %s, '', %s{cast})"
            if data is not None
            else "(%s, %s, %s, %s, %s, '')"
        )
        columns = "job_id, queue, kind, at, worker, stream_id"
        columns += ", detail" if data is not None else ""
        for start in range(0, len(rows), IN_CHUNK):
            chunk = rows[start : start + IN_CHUNK]
            params: list[Any] = []
            for i, (pk, q, _) in enumerate(chunk):
                params += [pk, q, kind, at, worker or ""]
                if data is not None:
                    params.append(event_detail(*data[start + i]))
            self._sql(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([mark] * len(chunk))}",
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
            .order_by("id").values("id", "job__job_id", "kind", "at", "worker", "detail")[:count]
        )  # fmt: skip
        return [
            Event(str(r["id"]), queue, _public_id(r["job__job_id"]), r["kind"], _ms(r["at"]),
                  r["worker"] or None, *detail_data(r["kind"], r["detail"]))
            for r in rows
        ]  # fmt: skip


def _floor(position: str) -> int:
    """A position of the database feed as its row id (``"0"``: before every row)."""
    return int(position.split("-")[0] or 0)


def event_detail(raw: bytes | None, content_type: str) -> str | None:
    """The ``detail`` column of an event carrying ``raw``: the exact bytes, base64 in JSON
    (a JSON value parsed by the database would not come back as it went in: ``jsonb`` reads
    1e16 back as an int), or that they were left out (over ``EVENT_DATA_MAX``)."""
    if raw is None:
        return None
    if len(raw) > EVENT_DATA_MAX:
        return '{"omitted": true}'
    return json.dumps({"raw": base64.b64encode(raw).decode(), "ct": content_type})


def detail_data(kind: str, detail: Any) -> tuple[Any, bool]:
    """(``Event.data``, ``Event.data_omitted``) from a ``detail`` column (see above); a
    detail written otherwise (the mirror's rows) carries nothing."""
    if not isinstance(detail, dict):
        return None, False
    if detail.get("omitted"):
        return None, True
    raw = detail.get("raw")
    if not isinstance(raw, str):
        return None, False
    try:
        value = base64.b64decode(raw)
    except ValueError:
        return None, False
    return event_data(kind, value, str(detail.get("ct") or "json")), False
