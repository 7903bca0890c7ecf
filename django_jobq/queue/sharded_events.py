"""The event feed of a sharded queue: every partition's events merged into one, resumable.

Each partition keeps its own event log (one stream per partition, each in its own slot), so
there is no single order to read: the feed is **ordered per partition, merged by time** (by
``at``, then partition index; two partitions' events of the same millisecond, or of clocks
that differ, have no defined order between them). What makes it resumable is the cursor: the
``id`` of each event of the merged feed is a *composite cursor*, ``s<N>:<id0>,...,<idN-1>``,
the position in every partition once that event was handed out, so ``since=<that id>`` resumes
after it without loss or repeats, wherever it was in the merge.

Only the current partitions are read: partitions of an earlier shard count (while a change of
count drains them) are read with ``queue.partition(name).events()``.
"""

from __future__ import annotations

from collections import deque

from ..errors import InvalidOption
from ..job import Event
from ..storage.base import Storage
from .events import _EVENT_ID

# An upper bound for a composite cursor's length: "s64:" and 64 ids of up to 41 characters.
MAX_CURSOR = 4 + 64 * 42


def encode_cursor(positions: list[str]) -> str:
    return f"s{len(positions)}:{','.join(positions)}"


def parse_cursor(since: object, shards: int) -> list[str]:
    """The per-partition positions of ``since``: "0" (every partition from its start) or a
    composite cursor of exactly ``shards`` partitions. Anything else is refused: a plain event
    id names a position in one partition only, and a cursor of another shard count positions
    in partitions this queue does not read."""
    if since == "0":
        return ["0"] * shards
    example = encode_cursor(["0"] * shards)
    if not isinstance(since, str) or len(since) > MAX_CURSOR or not since.startswith("s"):
        raise InvalidOption(
            f"since must be '0' or the id of an event of this sharded queue's feed (a cursor "
            f"such as {example!r}), got {since!r:.100}"
        )
    head, sep, body = since.partition(":")
    if not sep or not head[1:].isdigit() or str(int(head[1:])) != head[1:]:
        raise InvalidOption(f"since {since!r:.100} is not a cursor such as {example!r}")
    count = int(head[1:])
    if count != shards:
        raise InvalidOption(
            f"since {since!r:.100} is a cursor of {count} partitions; this queue has {shards}"
            " (after a change of shard count, read from '0' or per partition)"
        )
    positions = body.split(",")
    if len(positions) != shards or not all(_EVENT_ID.fullmatch(p) for p in positions):
        raise InvalidOption(
            f"since {since!r:.100} must list {shards} event ids (such as '0' or "
            f"'1700000000000-0') separated by commas"
        )
    return positions


class MergedEvents:
    """Pages of the merged feed, each event's ``id`` the composite cursor after it.

    Holds what it read beyond the page it answered (per partition, in order), so a caller
    that goes on from the last page's cursor is not re-read; a ``read`` after any other cursor
    starts afresh from it. Not thread-safe: one per reader."""

    def __init__(self, storage: Storage, logical: str, partitions: list[str]) -> None:
        self.storage, self.logical, self.partitions = storage, logical, partitions
        self.positions = ["0"] * len(partitions)
        self.buffers: list[deque[Event]] = [deque() for _ in partitions]
        # Per partition: whether more may follow its buffer without waiting (its last read
        # was a full page). A merge takes no event past a buffer that may have more behind it.
        self.more = [True] * len(partitions)
        self.cursor = encode_cursor(self.positions)

    def read(self, after: str, count: int, block: float | None = None) -> list[Event]:
        """Up to ``count`` events after cursor ``after`` in merged order; with ``block``,
        waits up to that long (one wait over every partition) when there is none."""
        if after != self.cursor:
            self.positions = parse_cursor(after, len(self.partitions))
            self.buffers = [deque() for _ in self.partitions]
            self.cursor = after
        # A partition read out may have had new events since: look again before merging.
        more = self.more = [m or not b for m, b in zip(self.more, self.buffers, strict=True)]
        if not any(self.buffers):
            self._fill(self.storage.read_events_many(self._asked(), count, block), count)
        out: list[Event] = []
        while len(out) < count:
            stale = {self.partitions[i]: self.positions[i] for i, m in enumerate(more)
                     if m and not self.buffers[i]}  # fmt: skip
            if stale:
                self._fill(self.storage.read_events_many(stale, count), count)
            heads = [i for i, b in enumerate(self.buffers) if b]
            if not heads:
                break
            i = min(heads, key=lambda i: (self.buffers[i][0].at, i))
            event = self.buffers[i].popleft()
            self.positions[i] = event.id
            self.cursor = encode_cursor(self.positions)
            # the constructor, not dataclasses.replace: a third of the merge's cost per event
            out.append(Event(self.cursor, self.logical, event.job_id, event.kind, event.at,
                             event.worker))  # fmt: skip
        return out

    def _asked(self) -> dict[str, str]:
        return dict(zip(self.partitions, self.positions, strict=True))

    def _fill(self, pages: dict[str, list[Event]], count: int) -> None:
        """Buffer what was read; a partition whose page was short has nothing more now."""
        for i, name in enumerate(self.partitions):
            if name in pages:
                self.buffers[i].extend(pages[name])
                self.more[i] = len(pages[name]) >= count
