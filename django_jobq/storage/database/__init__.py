"""Database backend: the Django models are the state, changed in short transactions.

Why it exists: an enqueue inside the caller's ``transaction.atomic()`` commits or rolls back
with the caller's own writes (the transactional-outbox guarantee Redis cannot give), and it needs
no server beyond the project's database: on SQLite it is the embedded default.

Concurrency rules:
- PostgreSQL: claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so workers never wait
  on each other; wake-ups travel by ``LISTEN/NOTIFY``, sent inside the transaction so a worker is
  woken only once the job is committed. A claim on a queue with limits first locks the queue's
  ``QueueConfig`` row, so limits are counted by one claimer at a time; a queue without limits
  takes no such lock.
- SQLite: one writer at a time. A transaction that reads and then writes fails at once with
  "database is locked" if another connection committed in between (WAL snapshot), so every write
  transaction here *starts* with a write (``_write_lock``), which waits on the busy timeout
  instead. SQLite has no cross-process signal; a watcher thread reads ``PRAGMA data_version``
  (which changes when any other connection commits, and costs no disk read) every
  ``poll_interval`` and wakes this process's waiters, so an idle worker neither runs claim
  queries in a loop nor sleeps through a new job.

Singleton successors are rows of their own under reserved ids (valid ids never contain ``~``):
a blocked successor waits under ``<id>~next``. When the run before it finishes, in the same
transaction that finished row is renamed ``<id>~<pk>`` and the successor takes ``<id>``; a
waiter of the finished run reads it by primary key, so it still gets that run's outcome.

Package layout: one module per concern, each a class layered on the one before, so a module
calls only what is below it (and mypy sees every method):

- ``core``: connections, transactions, raw SQL helpers, constants (``DatabaseCore``);
- ``wakeups``: NOTIFY/LISTEN, the SQLite watcher and every wait (``Wakeups``);
- ``events``: the event log (``Events``);
- ``failures``: failure handler calls (``FailureCalls``);
- ``bulk``: the PostgreSQL bulk insert of ``enqueue_many`` and its fast path (``BulkInsert``);
- ``enqueue``: enqueue, deduplication, scheduling, singleton successors (``Enqueue``);
- ``claim``: claim, acknowledgements, leases, flow control, the reaper (``ClaimAck``);
- ``operations``: operator actions, queue control, the worker registry (``Operations``);
- ``retention``: per-queue retention of finished rows, applied by the reaper pass
  (``Retaining``).
"""

from __future__ import annotations

from .retention import Retaining

__all__ = ["DatabaseStorage"]


class DatabaseStorage(Retaining):
    """The database backend (see the package docstring); every transition is inherited from
    the modules of this package."""

    supports_transactional_enqueue = True
