"""Journal mode (``durability="journal"``): every accepted enqueue is also a database row.

Redis with AOF ``everysec`` can lose the last second of writes, and a failover to a replica
can lose whatever the replica had not received. A job that the producer was told is accepted
must survive both, so in journal mode the job is first written to ``JournalEntry`` (in the
producer's transaction when one is open: the job is accepted exactly when the producer's rows
commit) and then sent to Redis (on commit). ``reconcile`` (``manage.py jobq_reconcile``, and
the reaper every ``JOURNAL["RECONCILE_INTERVAL"]`` seconds) re-creates in Redis every entry
whose job Redis no longer knows, under the same id with the same options, and deletes entries
whose job Redis reports finished. Re-sending is an ordinary enqueue, so a job Redis still knows
is never duplicated: its id answers ``duplicate``.

Entries are deleted when their job is known finished (Redis says so, or the mirror's row
finished after the entry was written); a job that finished but whose record Redis lost before
a reconcile saw it finished is re-created and runs again. That is the at-least-once price of
the journal (docs/durability.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, transaction

from ..conf import jobq_settings
from ..errors import StorageFull, StorageUnavailable
from ..job import (
    Dedup,
    DedupMode,
    EnqueueOutcome,
    JobOptions,
    JobUpdate,
    NewJob,
    RunAtUpdate,
    StoredEnqueue,
)
from ..states import TERMINAL_STATES, JobState
from ..validation import logical_name

if TYPE_CHECKING:
    from ..storage.base import Storage

logger = logging.getLogger("django_jobq.journal")

#: Rows per INSERT of a bulk enqueue (one statement, bounded size).
WRITE_CHUNK = 500


def journal_alias() -> str:
    return str(jobq_settings()["JOURNAL"]["DATABASE_ALIAS"])


def now_ms() -> int:
    return int(time.time() * 1000)


# -- encoding -----------------------------------------------------------------------------------


def encode_options(job: NewJob, now: int) -> dict[str, Any]:
    """Every option of ``job`` that re-creating it needs, as JSON. ``delay`` becomes an absolute
    due time (producer clock), so a re-created job is due when the original was."""
    o = job.options
    data: dict[str, Any] = {
        "o": [o.max_attempts, o.result_ttl, o.min_backoff, o.max_backoff, o.max_stalls,
              o.priority],
    }  # fmt: skip
    run_at = job.run_at
    if job.delay:
        run_at = max(run_at or 0, now + job.delay)
    if run_at:
        data["run_at"] = run_at
    if job.lifo:
        data["lifo"] = True
    if job.group is not None:
        data["group"] = job.group
    if job.singleton:
        data["singleton"] = True
    if job.update is not None:
        u = job.update
        data["update"] = [u.data, u.run_at.value, u.max_attempts, u.backoff, u.reset_counts]
    if job.dedup is not None:
        data["dedup"] = [job.dedup.key, job.dedup.mode.value, job.dedup.ttl]
    return data


def decode_job(job_id: str, payload: bytes, content_type: str, data: dict[str, Any]) -> NewJob:
    """The NewJob an entry was written from (without the waiter flag: nobody waits for it)."""
    update = None
    if "update" in data:
        d, run_at, m, b, c = data["update"]
        update = JobUpdate(d, RunAtUpdate(run_at), m, b, c)
    dedup = None
    if "dedup" in data:
        key, mode, ttl = data["dedup"]
        dedup = Dedup(key, DedupMode(mode), ttl)
    return NewJob(
        job_id, bytes(payload), JobOptions(*data["o"]), data.get("run_at"), 0, content_type,
        lifo=data.get("lifo", False), group=data.get("group"),
        singleton=data.get("singleton", False), update=update, dedup=dedup,
    )  # fmt: skip


# -- the write path -----------------------------------------------------------------------------


def write(queue: str, jobs: Sequence[NewJob], using: str) -> None:
    """Upsert one entry per job (the latest enqueue of an id wins: it is what Redis keeps when
    it updates a waiting job). Callers wrap this in a transaction."""
    from ..models import JournalEntry

    now = now_ms()
    # One INSERT ... ON CONFLICT cannot touch a row twice: the last enqueue of an id wins.
    latest = {job.job_id: job for job in jobs}
    rows = [
        JournalEntry(
            queue=queue,
            job_id=j.job_id,
            payload=j.payload,
            content_type=j.content_type,
            options=encode_options(j, now),
            created_ms=now,
        )  # fmt: skip
        for j in latest.values()
    ]
    manager = JournalEntry.objects.using(using)
    for start in range(0, len(rows), WRITE_CHUNK):
        manager.bulk_create(
            rows[start : start + WRITE_CHUNK],
            update_conflicts=True,
            unique_fields=["queue", "job_id"],
            update_fields=["payload", "content_type", "options", "created_ms"],
        )


def forget_settled(
    queue: str, jobs: Sequence[NewJob], results: Sequence[StoredEnqueue], using: str
) -> int:
    """Delete the entries Redis's answer made pointless: the id is already finished, or the
    enqueue was answered by the job holding its dedup key (this id was never stored)."""
    from ..models import JournalEntry

    stale = [
        job.job_id
        for job, result in zip(jobs, results, strict=True)
        if result.job_id != job.job_id or result.state in TERMINAL_STATES
    ]
    if not stale:
        return 0
    deleted, _ = JournalEntry.objects.using(using).filter(queue=queue, job_id__in=stale).delete()
    return deleted


def forget(
    queue: str, accepted_before: int, job_ids: Sequence[str] | None = None, using: str | None = None
) -> int:
    """Delete the entries of jobs an operator deleted from Redis (``obliterate``: every id;
    ``clean``: ``job_ids``), or ``reconcile`` would bring them back. Only entries accepted
    up to ``accepted_before`` (epoch ms, taken before the Redis deletion started) go: an id
    enqueued again meanwhile keeps its new entry, as its job may be in Redis again."""
    from ..models import JournalEntry

    entries = JournalEntry.objects.using(using or journal_alias()).filter(
        queue=queue, created_ms__lte=accepted_before
    )
    if job_ids is None:
        return entries.delete()[0]
    deleted = 0
    ids = list(job_ids)
    for start in range(0, len(ids), WRITE_CHUNK):
        deleted += entries.filter(job_id__in=ids[start : start + WRITE_CHUNK]).delete()[0]
    return deleted


def _pending(job: NewJob) -> StoredEnqueue:
    later = job.delay > 0 or (job.run_at is not None and job.run_at > now_ms())
    state = JobState.SCHEDULED if later else JobState.QUEUED
    return StoredEnqueue(EnqueueOutcome.PENDING, job.job_id, state)


def submit(
    queue: str,
    jobs: Sequence[NewJob],
    send: Callable[[Sequence[NewJob]], list[StoredEnqueue]],
) -> list[StoredEnqueue]:
    """Journal, then send with ``send`` (the storage's enqueue, wrapped by the Queue).

    Inside an atomic block on the journal's database: the entries join that transaction and
    the jobs are sent when it commits (nothing is sent, and no entry stays, if it rolls back);
    the outcome is ``pending``. Outside one: the entries are committed first, then sent; when
    Redis does not answer the outcome is ``pending`` too, since the committed entry is the
    acceptance and ``reconcile`` will send it. Any other error of the send propagates (the
    entry stays, so the job is still sent by ``reconcile``; a retry with the same id is safe).
    """
    using = journal_alias()
    if transaction.get_connection(using).in_atomic_block:
        write(queue, jobs, using)
        transaction.on_commit(partial(_send_after_commit, queue, jobs, send, using), using=using)
        return [_pending(job) for job in jobs]
    with transaction.atomic(using=using):
        write(queue, jobs, using)
    try:
        results = send(jobs)
    except StorageFull:
        raise  # Redis answered: it refused the write (the entry stays for reconcile)
    except StorageUnavailable as exc:
        logger.warning(
            "%s: Redis unreachable (%s); %d job(s) kept in the journal for jobq_reconcile",
            queue, exc, len(jobs),
        )  # fmt: skip
        return [_pending(job) for job in jobs]
    forget_settled(queue, jobs, results, using)
    return results


def _send_after_commit(
    queue: str,
    jobs: Sequence[NewJob],
    send: Callable[[Sequence[NewJob]], list[StoredEnqueue]],
    using: str,
) -> None:
    """The producer's transaction committed: its jobs are accepted whatever happens here, so a
    failure is logged, never raised into the code that committed; ``reconcile`` sends them."""
    try:
        results = send(jobs)
        forget_settled(queue, jobs, results, using)
    except Exception as exc:
        logger.warning(
            "%s: sending %d journaled job(s) after commit failed (%s: %s); jobq_reconcile "
            "will send them", queue, len(jobs), type(exc).__name__, exc,
        )  # fmt: skip


# -- reconcile ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ReconcileReport:
    """What one reconcile did on one queue (with ``dry_run``: what it would have done)."""

    checked: int = 0  # entries old enough to look at
    live: int = 0  # Redis knows the job and it has not finished: left alone
    recreated: int = 0  # Redis did not know the job: enqueued again, same id and options
    finished: int = 0  # the job finished (Redis or the mirror says so): entry deleted
    dropped: int = 0  # re-sending was answered by another job (its dedup key) or a finished id
    fenced: bool = False  # stopped: the queue was being obliterated (entries left to it)

    def __str__(self) -> str:
        return (
            f"checked {self.checked}, live {self.live}, recreated {self.recreated}, "
            f"finished {self.finished}, dropped {self.dropped}"
        )


def journal_queues(using: str) -> list[str]:
    from ..models import JournalEntry

    names = JournalEntry.objects.using(using).values_list("queue", flat=True).distinct()
    return sorted(set(names))


def reconcile(
    storage: Storage,
    queues: Iterable[str] | None = None,
    *,
    dry_run: bool = False,
    min_age: float | None = None,
    batch: int | None = None,
    using: str | None = None,
) -> dict[str, ReconcileReport]:
    """Re-create in Redis every journaled job it lost; delete entries of finished jobs.

    Entries younger than ``min_age`` seconds are skipped: their push may still be on the way
    (re-sending them would be harmless, dedup by id, but would report a recreation that was
    none). Entries are read ``batch`` at a time in primary-key order, payloads only for the
    jobs to re-create, so a journal of any size is reconciled in bounded memory.
    """
    conf = jobq_settings()["JOURNAL"]
    using = using or conf["DATABASE_ALIAS"]
    min_age = conf["MIN_AGE"] if min_age is None else min_age
    batch = batch or conf["BATCH"]
    names = journal_queues(using)
    if queues:  # a sharded queue's name stands for its partitions' entries (any count's)
        wanted = set(queues)
        names = sorted({*wanted, *(n for n in names if logical_name(n) in wanted)})
    cutoff = now_ms() - int(min_age * 1000)
    return {
        name: _reconcile_queue(storage, name, cutoff, dry_run=dry_run, batch=batch, using=using)
        for name in names
    }


def _reconcile_queue(
    storage: Storage, queue: str, cutoff: int, *, dry_run: bool, batch: int, using: str
) -> ReconcileReport:
    from ..models import JournalEntry

    report = ReconcileReport()
    entries = JournalEntry.objects.using(using).filter(queue=queue, created_ms__lte=cutoff)
    last_pk = 0
    while True:
        # Read before the entries: an obliterate that starts after this moves it, and the
        # re-creation below is then refused (an entry read before the obliterate deleted it
        # would otherwise bring its job back). Odd: an obliterate is under way, wait for it.
        generation = _generation(storage, queue)
        if generation % 2:
            report.fenced = True
            return report
        rows = list(
            entries.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "job_id", "created_ms")[:batch]
        )
        if not rows:
            return report
        last_pk = rows[-1][0]
        report.checked += len(rows)
        states = storage.job_states(queue, [job_id for _, job_id, _ in rows])
        finished, missing = [], []
        for row, state in zip(rows, states, strict=True):
            if state is None:
                missing.append(row)
            elif state in TERMINAL_STATES:
                finished.append(row[0])
            else:
                report.live += 1
        done_in_mirror = _finished_in_mirror(queue, missing) | _removed(storage, queue, missing)
        finished += [pk for pk, job_id, _ in missing if job_id in done_in_mirror]
        missing = [row for row in missing if row[1] not in done_in_mirror]
        report.finished += len(finished)
        if dry_run:
            report.recreated += len(missing)
            continue
        # created_ms <= cutoff: an id enqueued again since we read it keeps its new entry.
        entries.filter(pk__in=finished).delete()
        if missing and not _recreate(
            storage, queue, [pk for pk, _, _ in missing], entries, report, generation
        ):
            return report


def _generation(storage: Storage, queue: str) -> int:
    """The queue's obliteration generation (Redis; 0 where nothing obliterates behind us)."""
    read = getattr(storage, "generation", None)
    return 0 if read is None else int(read(queue))


def _recreate(
    storage: Storage, queue: str, pks: list[int], entries: Any, report: ReconcileReport,
    generation: int,
) -> bool:  # fmt: skip
    """Enqueue the entries' jobs again; False when an obliterate started since the entries
    were read (nothing was enqueued: the entries are its to delete)."""
    rows = list(entries.filter(pk__in=pks).values_list("pk", "job_id", "payload",
                                                          "content_type", "options"))  # fmt: skip
    if not rows:
        return True
    jobs = [decode_job(job_id, payload, ctype, opts) for _, job_id, payload, ctype, opts in rows]
    storage.register_queue(queue)
    fenced = getattr(storage, "enqueue_fenced", None)
    if fenced is None:
        results = storage.enqueue_many(queue, jobs)
    elif (answer := fenced(queue, jobs, generation)) is None:
        logger.info("%s: obliterated while reconciling; nothing re-created", queue)
        report.fenced = True
        return False
    else:
        results = answer
    stale, recreated = [], []
    for (pk, *_), job, result in zip(rows, jobs, results, strict=True):
        if result.job_id != job.job_id or result.state in TERMINAL_STATES:
            stale.append(pk)
        elif result.outcome is EnqueueOutcome.QUEUED:
            recreated.append(job.job_id)
        else:  # its push landed between our read and this enqueue
            report.live += 1
    report.recreated += len(recreated)
    report.dropped += len(stale)
    if recreated:
        more = f" and {len(recreated) - 5} more" if len(recreated) > 5 else ""
        logger.warning(
            "%s: re-created %d job(s) Redis lost from the journal: %s%s",
            queue, len(recreated), ", ".join(recreated[:5]), more,
        )  # fmt: skip
    if stale:
        entries.filter(pk__in=stale).delete()
    return True


def _removed(storage: Storage, queue: str, rows: list[tuple[int, str, int]]) -> set[str]:
    """Ids whose record the queue's retention removed after their entry was written (a
    ``removed`` event in the stream): the job finished; nothing is lost. Needed when no
    mirror runs, since the mirror is what otherwise forgets their entries."""
    removed_since = getattr(storage, "removed_since", None)
    if not rows or removed_since is None:
        return set()
    created = {job_id: created_ms for _, job_id, created_ms in rows}
    found = removed_since(queue, min(created.values()), list(created))
    return {job_id for job_id, at in found.items() if at >= created[job_id]}


def _finished_in_mirror(queue: str, rows: list[tuple[int, str, int]]) -> set[str]:
    """Ids whose mirror row finished after their entry was written: the job ran to the end
    and only its Redis record is gone (expired, cleaned). Empty when there is no mirror."""
    if not rows:
        return set()
    from ..models import Job

    created = {job_id: created_ms for _, job_id, created_ms in rows}
    alias = jobq_settings()["MIRROR"]["DATABASE_ALIAS"]
    try:
        found = (
            Job.objects.using(alias)
            .filter(
                queue=queue, job_id__in=list(created), state__in=[s.value for s in TERMINAL_STATES]
            )
            .values_list("job_id", "finished_at")
        )
        return {
            job_id
            for job_id, finished_at in found
            if finished_at is not None and finished_at.timestamp() * 1000 >= created[job_id]
        }
    except DatabaseError as exc:  # no mirror table there: Redis's word is all we have
        logger.debug("mirror not consulted for %s: %s", queue, exc)
        return set()
