"""The public event feed: a queue's transitions as an iterator, resumable by event id.

Every backend already records each job's transitions in order (the Redis stream the mirror
reads, the database's ``JobEvent`` rows, the memory backend's deque): this reads that record
for users who react to outcomes elsewhere. Delivery is at-least-once from the caller's side:
keep the id of the last event handled and pass it back as ``since`` to resume after it. What a
backend keeps is bounded (Redis and memory: ``EVENTS_MAXLEN`` per queue; database: as long as
the job's row); a position whose following events were removed unread raises ``EventsLost``
from the storage read, so a feed never goes on past a gap.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from ..errors import InvalidOption
from ..job import Event
from ..states import JobState

# What the ``kind`` of an event can be: the state a job entered, or a report of it.
KINDS = frozenset({state.value for state in JobState}) | frozenset({
    "retried", "released", "postponed", "stalled", "progress", "log",
    "removed",  # the queue's retention deleted the finished record (Redis and memory)
})  # fmt: skip
_EVENT_ID = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")


def validate_since(since: object) -> str:
    if not isinstance(since, str) or not _EVENT_ID.fullmatch(since):
        raise InvalidOption(f"since must be an event id such as '0' or '1700000000000-0', "
                            f"got {since!r}")  # fmt: skip
    return since


def validate_kinds(kinds: Iterable[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [kinds]
    chosen = frozenset(kinds)
    unknown = chosen - KINDS
    if unknown or not chosen:
        raise InvalidOption(f"kinds must be some of {sorted(KINDS)}, got {sorted(unknown)}")
    return chosen


# read(after, count, block) -> the page of events after ``after`` (a queue's feed, or the
# merged feed of a sharded queue: sharded_events.MergedEvents.read).
PageReader = Callable[[str, int, float | None], list[Event]]


def iterate_pages(
    read: PageReader, since: str, kinds: frozenset[str] | None, *,
    follow: bool, wait: float, batch: int,
) -> Iterator[Event]:  # fmt: skip
    """The paging loop of every event feed: pages of ``batch`` after ``since``, filtered by
    ``kinds``; with ``follow`` each read blocks up to ``wait`` seconds and the loop never ends
    by itself."""
    after = since
    while True:
        page = read(after, batch, wait if follow else None)
        for event in page:
            after = event.id
            if kinds is None or event.kind in kinds:
                yield event
        if not follow and len(page) < batch:
            return


async def aiterate_pages(
    read: PageReader, since: str, kinds: frozenset[str] | None, *,
    follow: bool, wait: float, batch: int,
) -> AsyncIterator[Event]:  # fmt: skip
    """``iterate_pages`` for asyncio: each page is read in a thread, so the loop never blocks."""
    after = since
    while True:
        page = await asyncio.to_thread(read, after, batch, wait if follow else None)
        for event in page:
            after = event.id
            if kinds is None or event.kind in kinds:
                yield event
        if not follow and len(page) < batch:
            return
