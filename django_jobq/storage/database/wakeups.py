"""Wake-ups: how a waiting worker, a caller waiting on an outcome or an event reader learns
that something changed, without polling the database in a loop. PostgreSQL: ``NOTIFY`` inside the
writing transaction, one ``LISTEN`` connection per storage; SQLite: a thread that watches
``PRAGMA data_version``; in this process: a condition variable with a generation number."""

from __future__ import annotations

import base64
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from ...job import FinalOutcome
from ...states import TERMINAL_STATES, JobState
from .core import DatabaseCore, _bytes, _json_bytes, _ms, logger

CHANNEL = "django_jobq"
RECHECK = 2.0  # seconds: longest wait without re-reading the database (see _wait)
DONE_MEMO = 10_000  # jobs whose "done" signal is remembered for their waiters (per process)
WAITED_MEMO = 10_000  # remembered (queue, id) -> row of enqueues with a waiter (per process)


class Wakeups(DatabaseCore):
    """Signals sent by transitions and the waits that end on them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Wake-ups: every signal bumps a generation number. A waiter compares it with the value
        # it saw *before* reading the database, so a signal that lands between its read and its
        # wait is never lost (the classic missed wake-up of condition variables).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._generation = 0
        # Workers compare with ``_work`` instead, and sleep on a condition of their own (same
        # lock): it skips the "done" signals, which make nothing claimable (whatever does, a
        # freed slot, a released successor, sends its own "w"), so a worker is neither
        # woken into an empty claim nor roused at all by every completion, its own included.
        self._work = 0
        self._work_cond = threading.Condition(lock)
        self._claim_seen: dict[str, int] = {}
        self._interrupted: set[str] = set()
        self._listener: _PgListener | _SqliteWatcher | None = None
        # The row each enqueue with a waiter joined, so that wait_for_outcome follows that row
        # even once a singleton successor has taken over the id.
        self._waited: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._waited_lock = threading.Lock()
        # Outcome waiters wake on their own job's "done" signal, not on every signal: a
        # request/response would otherwise re-read its row at the enqueue's and every other
        # job's NOTIFY. ``_done`` counts the "done" signals of each job (the newest
        # DONE_MEMO jobs); ``_broad`` counts the signals every waiter must look after (a
        # whole queue's jobs ended, a listener reconnected: a signal may have been missed).
        self._done: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._broad = 0
        # The outcomes that completion signals carried (``d <queue> <id> <pk> <expires>
        # <result>``), kept only for the jobs a waiter of this process watches: such a waiter
        # returns without reading the row. ``_watched`` counts the waiters of each job.
        self._watched: dict[tuple[str, str], int] = {}
        self._carried: dict[tuple[str, str], tuple[int, int, str]] = {}

    @property
    def supports_blocking_wait(self) -> bool:  # type: ignore[override]
        return self.vendor == "postgresql"

    def _signal(self, message: str) -> None:
        """Wake waiters once this transaction commits: NOTIFY for other processes (PostgreSQL),
        the condition for this one. Messages: ``w <queue>`` (work to claim), ``d <queue>
        <id>`` (that job ended; its outcome waiters re-read it), ``d <queue> <id> <pk>
        <expires ms> <base64 result>`` (that row completed with that result: its waiters need
        no read; sent by ``_complete_statement``), ``d <queue>`` (jobs of the queue ended).
        Queue names and job ids hold no spaces (validation.py)."""
        if self.vendor == "postgresql":
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, message])
        transaction.on_commit(lambda: self._wake_local(message), using=self.using)

    def _wake_local(self, message: str | None = None) -> None:
        """One signal: workers wake on any but a "done" one; outcome waiters on a ``d``
        signal of their job or queue, or on one of unknown meaning (None: a listener
        (re)connected)."""
        with self._cond:
            self._generation += 1
            work = self._work
            if message is None:
                self._broad += 1
                self._work += 1
            elif message.startswith("d "):
                _, queue, *rest = message.split(" ", 5)
                if rest:
                    key = (queue, rest[0])
                    self._done[key] = self._done.pop(key, 0) + 1
                    while len(self._done) > DONE_MEMO:
                        self._done.popitem(last=False)
                    if len(rest) == 4 and key in self._watched:
                        self._carried[key] = (int(rest[1]), int(rest[2]), rest[3])
                else:
                    self._broad += 1
            else:
                self._work += 1
            if self._work != work:
                self._work_cond.notify_all()
            self._cond.notify_all()

    def _wake_done(self, messages: Sequence[str]) -> None:
        """This process's outcome waiters (after a commit that ended their jobs): the "done"
        ``messages`` the commit also sent as NOTIFYs."""
        for message in messages:
            self._wake_local(message)

    @contextmanager
    def _watch(self, key: tuple[str, str]) -> Iterator[None]:
        """While an outcome waiter of ``key`` waits: keep what its job's completion signal
        carries (see ``_carried_outcome``)."""
        with self._cond:
            self._watched[key] = self._watched.get(key, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._watched.pop(key) - 1
                if left:
                    self._watched[key] = left
                else:
                    self._carried.pop(key, None)

    def _carried_outcome(self, key: tuple[str, str], pk: int | None) -> FinalOutcome | None:
        """The outcome row ``pk`` of ``key`` sent with its completion signal, if one came and
        its record has not expired since (the read's rule); None: read the row."""
        with self._cond:
            carried = self._carried.get(key)
        if carried is None or pk is None or carried[0] != pk or carried[1] <= self._now():
            return None
        return FinalOutcome(JobState.COMPLETED, base64.b64decode(carried[2]), None)

    def _outcome_mark(self, key: tuple[str, str]) -> tuple[int, int]:
        """What an outcome waiter of ``key`` compares with; taken before it reads the row."""
        self._ensure_listener()
        with self._cond:
            return self._broad, self._done.get(key, 0)

    def _wait_done(self, key: tuple[str, str], timeout: float, since: tuple[int, int]) -> None:
        """Sleep until ``key`` has a newer "done" signal than ``since``, a broad one arrives,
        or ``timeout`` (capped at RECHECK, as ``_wait``)."""
        cap = RECHECK if self._listener is not None else self.poll_interval
        deadline = time.monotonic() + min(timeout, cap)
        with self._cond:
            while (self._broad, self._done.get(key, 0)) == since:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)

    def _snapshot(self, *, work: bool = False) -> int:
        """The generation to hand to ``_wait`` afterwards (``work``: the count of signals
        workers wake on); take it before reading the database. It also starts the
        cross-process listener, so that no commit after it is missed."""
        self._ensure_listener()
        with self._cond:
            return self._work if work else self._generation

    def _wait(
        self, timeout: float, since: int, worker_id: str | None = None, *, work: bool = False
    ) -> bool:
        """Sleep until a signal newer than ``since`` (a ``_snapshot`` with the same ``work``;
        PostgreSQL: from any process; SQLite: from this process), an interrupt of
        ``worker_id``, or ``timeout``. True when the interrupt ended it.

        Waits are capped at ``RECHECK`` seconds as a safety net for signals lost while a
        listener was reconnecting; an in-memory SQLite database (no watcher possible) re-reads
        every ``poll_interval``."""
        cap = RECHECK if self._listener is not None else self.poll_interval
        deadline = time.monotonic() + min(timeout, cap)
        interrupted = False
        cond = self._work_cond if work else self._cond
        with self._cond:
            while (self._work if work else self._generation) == since:
                if worker_id is not None and worker_id in self._interrupted:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                cond.wait(remaining)
            if worker_id is not None:
                interrupted = worker_id in self._interrupted
                self._interrupted.discard(worker_id)
        return interrupted

    def _ensure_listener(self) -> None:
        if self._listener is None:
            with self._cond:
                if self._listener is None:
                    if self.vendor == "postgresql":
                        self._listener = _PgListener(self.using, self._wake_local)
                    else:
                        path = connections[self.using].settings_dict["NAME"]
                        if not path or str(path) == ":memory:" or "mode=memory" in str(path):
                            return  # nothing another process could commit to
                        self._listener = _SqliteWatcher(
                            str(path), self._wake_local, self.poll_interval
                        )
                    self._listener.start()
        self._listener.ready.wait(5)

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        self._wait_for_work(timeout, worker_id)

    def _wait_for_work(self, timeout: float, worker_id: str | None) -> bool:
        """``wait_for_jobs``; True when ``interrupt_wait`` ended it. The wait compares with
        the signals counted when the worker's last claim began, so a job committed between
        that claim and this wait ends it at once."""
        with self._cond:
            since = self._claim_seen.pop(worker_id or "", None)
        if since is None:
            since = self._snapshot(work=True)
        return self._wait(timeout, since, worker_id, work=True)

    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        with self._cond:
            self._interrupted.add(worker_id)
            self._work_cond.notify_all()
            self._cond.notify_all()

    def _remember_waiter(self, queue: str, job_id: str, pk: int) -> None:
        with self._waited_lock:
            self._waited[(queue, job_id)] = pk
            self._waited.move_to_end((queue, job_id))
            while len(self._waited) > WAITED_MEMO:
                self._waited.popitem(last=False)

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        with self._watch((queue, job_id)):
            return self._outcome_until(queue, job_id, time.monotonic() + timeout)

    def _outcome_until(
        self, queue: str, job_id: str, deadline: float, since: tuple[int, int] | None = None
    ) -> FinalOutcome | None:
        """Waits on the row the caller's enqueue joined (or, failing that, the row under
        ``job_id`` when the wait starts), by primary key: a singleton successor that takes
        over the id afterwards is another run, with an outcome of its own.

        ``since``: an ``_outcome_mark`` taken before the enqueue that registered this waiter
        (``enqueue_and_wait``). Any end of the job after that enqueue sends a newer signal,
        and an end before it was the enqueue's own answer, so the first read of the row is
        skipped: the wait starts at once and the row is read when its signal comes, unless
        the signal carried the completed row's result (``_carried_outcome``; the caller
        ``_watch``es ``key``), which then is the answer without a read."""
        with self._waited_lock:
            pk = self._waited.pop((queue, job_id), None)
        fields = ("id", "state", "result", "error", "expires_at")
        key = (queue, job_id)
        while True:
            if since is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._wait_done(key, remaining, since)
                carried = self._carried_outcome(key, pk)
                if carried is not None:
                    return carried
            since = self._outcome_mark(key)
            if pk is None:
                row = self._jobs().filter(queue=queue, job_id=job_id).values(*fields).first()
                pk = row["id"] if row is not None else None
            else:
                row = self._jobs().filter(pk=pk).values(*fields).first()
            live = row is not None and (
                row["expires_at"] is None or _ms(row["expires_at"]) > self._now()
            )
            if live and row["state"] in TERMINAL_STATES:
                return FinalOutcome(
                    JobState(row["state"]), _bytes(row["result"]), _json_bytes(row["error"])
                )

    def close(self) -> None:
        """Stop the listener and wait for it (up to 5 s; it looks every 0.5 s): its LISTEN
        connection is closed when this returns, so whatever comes next (dropping the database,
        a migration that locks it, a test run's teardown) does not find it still open."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
            if listener is not threading.current_thread():
                listener.join(5)


class _Watcher(threading.Thread):
    """A storage's wake-up thread, holding its storage only weakly.

    The thread calls the storage's ``_wake_local``; held strongly, that bound method kept a
    storage dropped without ``close()`` alive for as long as its own thread ran, i.e. until
    the process exited, with its connection (a PostgreSQL LISTEN session) open. A ``JOBQ``
    setting change drops the process's storage that way (``backend.reset_storage``: anything
    still holding the old storage may go on using it, so it is not closed), and so does any
    storage a program builds and lets go. Now the thread ends at its next look once the
    storage is collected (within 0.5 s on PostgreSQL, one poll interval on SQLite) and
    closes its connection on the way out."""

    def __init__(self, name: str, wake: Callable[[str | None], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._owner = weakref.WeakMethod(wake)
        self.ready = threading.Event()
        self._stopping = threading.Event()  # (Thread has a _stop of its own)

    def running(self) -> bool:
        """Neither stopped nor orphaned (its storage collected)."""
        return not self._stopping.is_set() and self._owner() is not None

    def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (a stop ends it early); whether to go on."""
        return not self._stopping.wait(seconds) and self._owner() is not None

    def wake(self, message: str | None) -> None:
        wake = self._owner()
        if wake is not None:
            wake(message)

    def stop(self) -> None:
        self._stopping.set()


class _PgListener(_Watcher):
    """One LISTEN connection per storage, outside Django's pool, that turns NOTIFYs from any
    process into wake-ups of this process's waiters."""

    def __init__(self, using: str, wake: Callable[[str | None], None]) -> None:
        super().__init__("jobq-pg-listener", wake)
        self.using = using
        # The server process of the LISTEN connection while it is up (pg_stat_activity.pid):
        # for an operator (or a test) to tell this connection from the others.
        self.backend_pid: int | None = None

    def run(self) -> None:
        import psycopg

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        while self.running():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.backend_pid = conn.info.backend_pid
                    self.ready.set()
                    # Whatever was sent while (re)connecting is unknown: let waiters re-read.
                    self.wake(None)
                    while self.running():
                        for notify in conn.notifies(timeout=0.5, stop_after=64):
                            self.wake(notify.payload)
            except Exception as exc:  # database restart: reconnect; waiters re-read meanwhile
                logger.warning("LISTEN connection lost (%s); reconnecting", exc)
                self.pause(1.0)
        self.ready.set()


class _SqliteWatcher(_Watcher):
    """Turns commits of other connections (any process) into wake-ups: ``data_version`` is
    read from the WAL index in shared memory, so the check is cheap enough to run often."""

    def __init__(self, path: str, wake: Callable[[str | None], None], interval: float) -> None:
        super().__init__("jobq-sqlite-watcher", wake)
        self.path = path
        self.interval = interval

    def run(self) -> None:
        import sqlite3

        while self.running():
            try:
                conn = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
                try:
                    seen = conn.execute("PRAGMA data_version").fetchone()[0]
                    self.ready.set()
                    self.wake(None)
                    while self.pause(self.interval):
                        version = conn.execute("PRAGMA data_version").fetchone()[0]
                        if version != seen:  # a commit, of unknown meaning: everyone looks
                            seen = version
                            self.wake(None)
                finally:
                    conn.close()
            except Exception as exc:  # file replaced or locked for long: start over
                logger.warning("SQLite watcher error (%s); restarting", exc)
                self.pause(1.0)
        self.ready.set()
