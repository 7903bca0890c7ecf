"""Every transition a backend makes, as its event stream tells it, checked against the one spec
(``django_jobq.states.TRANSITIONS``).

Each event names a job id and a kind. A kind that is a ``JobState`` value is the state the job
entered; the others say how it got there (read off the three implementations: memory
``storage/memory/``, the database ``storage/database/``, the Lua scripts
``storage/redis/lua/``):

* ``released`` (release), ``stalled`` (reap: lease expired), ``retried`` (an operator's retry):
  the job entered ``queued``;
* ``postponed`` (the handler was rate limited): it entered ``scheduled``;
* ``blocked``: a singleton successor was stored behind the running job of that id;
* ``removed``: retention deleted the finished record (the id's incarnation ends);
* ``progress``, ``log``: the running attempt reported; no move.

An id's history is kept per incarnation: a record created again after its old one was deleted
(expired, removed, purged, obliterated, lost with the queue's data) starts from "new" (None).
A singleton successor is an incarnation of its own, tracked beside the running one under the
same id: its ``blocked`` entry, then either its ``cancelled`` (an operator's cancel) or, in the
step that ends the run before it, its ``queued``/``scheduled`` (it takes the id over).

Events of records a step deleted may be gone with them (the database backend deletes a row's
events with the row), so a move can go unseen; a move seen is never one the spec lacks. The
test then holds the history to the model (``agree``): a job whose record exists must have
arrived, event by event, in the state the model says.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django_jobq import states
from django_jobq.job import Event
from django_jobq.states import TERMINAL_STATES, JobState

# How a new record starts: due now, or later (a successor starts blocked).
ENTRY_STATES = frozenset({JobState.QUEUED, JobState.SCHEDULED})
ENTERS = {
    **{s.value: s for s in JobState},
    "released": JobState.QUEUED,
    "stalled": JobState.QUEUED,
    "retried": JobState.QUEUED,
    "postponed": JobState.SCHEDULED,
}
REPORTS = frozenset({"progress", "log"})
TAKE_OVER = frozenset({"queued", "scheduled"})  # a released successor's first event
PAGE = 1000

# Every (from, to) seen in this process, for coverage (``JOBQ_MODEL_COVERAGE=1`` prints it).
SEEN: Counter[tuple[str, str]] = Counter()


@dataclass
class History:
    """What the events said of one job id so far."""

    state: JobState | None = None  # the record's (None: no record, or not seen yet)
    successor: JobState | None = None  # its blocked successor's, if one was stored


@dataclass
class TransitionLog:
    storage: object
    queue: str
    after: str = "0"
    ids: dict[str, History] = field(default_factory=dict)

    def read(self) -> list[Event]:
        events: list[Event] = []
        while True:
            page = self.storage.read_events(self.queue, self.after, PAGE)
            events += page
            if page:
                self.after = page[-1].id
            if len(page) < PAGE:
                return events

    def restart(self) -> None:
        """The queue's data and its event stream are gone: every id starts from new."""
        self.after = "0"
        self.ids.clear()

    def observe(self) -> list[tuple[str, JobState | None, JobState]]:
        """Read the events since the last call and check each move they show against the
        spec. Returns the moves (id, from, to), in order."""
        events = self.read()
        moves = []
        for i, event in enumerate(events):
            history = self.ids.setdefault(event.job_id, History())
            later = (e.kind for e in events[i + 1 :] if e.job_id == event.job_id)
            for src, dst in self._moves(history, event.kind, next(later, None), event):
                self._check(event, src, dst)
                moves.append((event.job_id, src, dst))
        return moves

    def _moves(self, h: History, kind: str, next_kind: str | None, event: Event):
        if kind in REPORTS:
            assert h.state is JobState.ACTIVE, f"{event}: a report of a job {h.state}"
            return []
        if kind == "removed":
            assert h.state in TERMINAL_STATES, f"{event}: retention removed a job {h.state}"
            h.state = None
            return []
        if kind == "blocked":
            if h.successor is None:
                h.successor = JobState.BLOCKED
                return [(None, JobState.BLOCKED)]
            return [(JobState.BLOCKED, JobState.BLOCKED)]
        assert kind in ENTERS, f"{event}: an event kind the spec does not know"
        dst = ENTERS[kind]
        if h.successor is not None:
            if kind in TAKE_OVER and (h.state in TERMINAL_STATES or h.state is JobState.ACTIVE):
                # The run before it ended (its final event seen, or deleted with its row): the
                # successor takes the id over.
                src, h.state, h.successor = h.successor, dst, None
                return [(src, dst)]
            if kind == "cancelled" and next_kind not in TAKE_OVER:
                src, h.successor = h.successor, None  # a cancel ends the successor, not the run
                return [(src, dst)]
        src, h.state = h.state, dst
        return [(src, dst)]

    @staticmethod
    def _check(event: Event, src: JobState | None, dst: JobState) -> None:
        SEEN[(src or "new", dst)] += 1
        if src is None:
            assert dst in ENTRY_STATES | {JobState.BLOCKED}, (
                f"{event}: a new record of {event.job_id!r} started {dst}"
            )
            return
        # Read through the module, so that a test can take a transition out of the spec.
        assert (src, dst) in states.TRANSITIONS, (
            f"{event}: {event.job_id!r} moved {src} -> {dst}, a transition "
            "django_jobq.states.TRANSITIONS does not declare"
        )

    def agree(self, job_id: str, state: JobState | None, successor: bool) -> None:
        """Hold the history of ``job_id`` to the model's record (None: none) and whether it has
        a successor. A record or successor that is gone ends its incarnation: the events of
        its end may have gone with it."""
        h = self.ids.get(job_id)
        if state is None:
            self.ids.pop(job_id, None)
            return
        assert h is not None and h.state is state, (
            f"{job_id}: the record is {state}, its events say "
            f"{None if h is None else h.state}: a move without its event"
        )
        if not successor:
            h.successor = None
        else:
            assert h.successor is JobState.BLOCKED, f"{job_id}: a successor without its event"
