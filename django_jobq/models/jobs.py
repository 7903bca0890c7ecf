"""Job state: with the database backend these rows *are* the state (``storage/database/``
changes them in short transactions); with Redis ``Job``, ``JobEvent`` and ``WorkerInfo`` are a
read-only mirror written in batches from the event streams (``mirror/``), for the admin, the API
and analytics. The hot path never waits on the mirror. Journal mode's entries are here too:
a copy of every accepted job of a journal queue, for Redis to be reconciled with.
"""

from __future__ import annotations

from django.db import models

from ..states import JobState


class JobQuerySet(models.QuerySet):
    """QuerySet methods named after states, so callers read like the state machine."""

    def in_queue(self, queue: str) -> JobQuerySet:
        return self.filter(queue=queue)

    def queued(self) -> JobQuerySet:
        return self.filter(state=JobState.QUEUED)

    def scheduled(self) -> JobQuerySet:
        return self.filter(state__in=(JobState.SCHEDULED, JobState.RETRYING))

    def active(self) -> JobQuerySet:
        return self.filter(state=JobState.ACTIVE)

    def finished(self) -> JobQuerySet:
        return self.filter(state__in=(JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED))


class Job(models.Model):
    queue = models.CharField(max_length=64)
    # 128 for a job id, plus room for the database backend's reserved names "<id>~next" (a
    # blocked singleton successor) and "<id>~<pk>" (a finished run its successor replaced):
    # valid ids never contain "~", so these never clash with a real id.
    job_id = models.CharField(max_length=160)
    handler = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    # Exact bytes as enqueued (JSON or msgpack, see content_type): the worker decodes them.
    payload = models.BinaryField(default=b"")
    content_type = models.CharField(max_length=16, default="json")
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)  # {"type", "message", "traceback"}
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    stalls = models.PositiveIntegerField(default=0)
    max_stalls = models.PositiveIntegerField(default=1)
    priority = models.IntegerField(default=0)
    min_backoff = models.PositiveIntegerField(default=1000)  # ms
    max_backoff = models.PositiveIntegerField(default=3_600_000)  # ms
    result_ttl = models.PositiveBigIntegerField(default=86_400_000)  # ms
    run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # finished record (and dedup) ends
    worker = models.CharField(max_length=128, blank=True, default="")
    token = models.PositiveBigIntegerField(default=0)  # fencing token of the current claim
    lease_deadline = models.DateTimeField(null=True, blank=True)
    waiters = models.PositiveIntegerField(default=0)
    # What the handler reported while running (job.set_progress / job.log): progress is its
    # latest JSON value, logs the last LOG_LINES [epoch ms, message] pairs. Nullable, so the
    # raw INSERTs that do not name them need no database default.
    progress = models.JSONField(null=True, blank=True)
    logs = models.JSONField(null=True, blank=True)
    # "stop" / "force": an operator asked the running attempt to stop (Queue.cancel of an
    # active job); its worker ends it cancelled. Kept until the job ends.
    cancel_requested = models.CharField(max_length=8, blank=True, default="", db_default="")
    # Scheduling (issue 4). Database defaults too, because the Redis mirror inserts rows with
    # raw SQL that names only the columns it knows.
    lifo = models.BooleanField(default=False, db_default=False)
    group = models.CharField(
        max_length=128, blank=True, default="", db_default="", db_column="job_group"
    )  # rate-limit group ("" for none); "group" is an SQL keyword, hence the column name
    dedup_key = models.CharField(max_length=128, blank=True, default="", db_default="")
    # Claim order within a priority, fixed at enqueue: 0 for FIFO jobs (then by id, i.e.
    # enqueue order), -id for LIFO jobs, so every LIFO job comes first, newest first.
    order_key = models.BigIntegerField(default=0, db_default=0)
    # A blocked singleton successor waits under "<job_id>~next" (database backend).
    has_successor = models.BooleanField(default=False, db_default=False)
    # Redis mirror only: the newest stream event this row's record was read after (as
    # mirror.sql.stream_seq), so that a mirror holding an older event cannot write its older
    # record over it (two mirrors at once). 0 on the database backend.
    mirror_seq = models.BigIntegerField(default=0, db_default=0)

    objects = JobQuerySet.as_manager()

    class Meta:
        # Every index here is written by every enqueue of a row it covers, so each one must
        # serve a query that needs it (migration 0022: a fresh queued row enters 6 indexes on
        # PostgreSQL, where it entered 12, and its event 4 instead of 5). Indexes of a phase
        # of a job's life are partial on a column set only in that phase (``run_at``,
        # ``lease_deadline``, ``finished_at``): a row enters them when it reaches the phase.
        # Queries reach them through a range on that column, which implies ``IS NOT NULL``
        # also with parameters bound on the server (a generic plan cannot match a predicate
        # ``state = %s``), or say ``IS NOT NULL`` themselves.
        constraints = [
            # ``varchar_pattern_ops`` on PostgreSQL (elsewhere ignored): equality is the same,
            # and the same index also serves the admin's job id search, ``LIKE 'prefix%'``,
            # whatever the database's collation (migration 0019 had a second index for it).
            models.UniqueConstraint(
                fields=["queue", "job_id"], name="jobq_job_queue_id_uniq",
                opclasses=["varchar_ops", "varchar_pattern_ops"],
            )
        ]  # fmt: skip
        indexes = [
            # admin/API lists: per queue and state, newest first; state counts; oldest queued
            models.Index(fields=["queue", "state", "created_at"], name="jobq_job_q_state_created"),
            # claim order among queued jobs of a queue: lowest priority, then LIFO jobs newest
            # first, then FIFO (id). Only queued rows: a claimed or finished row leaves it (the
            # claims' SQL names the state as a literal, so the predicate always matches).
            models.Index(
                fields=["queue", "priority", "order_key", "id"], name="jobq_job_order",
                condition=models.Q(state="queued"),
            ),
            # promotion of due scheduled / retrying jobs, the next due time, parked parents,
            # the admin's oldest promoted job: rows with a due time only
            models.Index(
                fields=["queue", "state", "run_at"], name="jobq_job_due",
                condition=models.Q(run_at__isnull=False),
            ),
            # reaping of expired leases, per queue: running rows only
            models.Index(
                fields=["queue", "state", "lease_deadline"], name="jobq_job_lease",
                condition=models.Q(lease_deadline__isnull=False),
            ),
            # charts (rollup), result counts, the mirror's purge: finished rows only
            models.Index(
                fields=["finished_at"], name="jobq_job_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
            # Retention and dead letters: the newest finished rows of one queue and state, and
            # the oldest.
            models.Index(
                fields=["queue", "state", "finished_at"], name="jobq_job_q_state_done",
                condition=models.Q(finished_at__isnull=False),
            ),
            # API job lists: keyset pages on (created_at, id), newest first, with and without
            # a queue filter (measured: 278 ms for an unfiltered page of 300,000 rows without)
            models.Index(fields=["queue", "-created_at", "-id"], name="jobq_job_q_created_id"),
            models.Index(fields=["-created_at", "-id"], name="jobq_job_created_id"),
            # Lost jobs per queue (metrics, health): no other row enters it.
            models.Index(fields=["queue"], name="jobq_job_lost", condition=models.Q(state="lost")),
            # The admin's job list by handler (its filter, and search by the beginning of a
            # handler name: ``varchar_pattern_ops`` serves LIKE 'prefix%' on PostgreSQL),
            # newest first: 0.8-2.1 s on a million rows without it (migration 0029).
            models.Index(
                fields=["handler", "created_at", "id"], name="jobq_job_handler",
                opclasses=["varchar_pattern_ops", "timestamptz_ops", "int8_ops"],
            ),
            # The admin's job list filtered by state, newest first: its deep pages (OFFSET
            # 50,000 of the failed jobs sorted every one of them: 0.4-0.6 s on a million rows).
            models.Index(fields=["state", "created_at", "id"], name="jobq_job_state_created"),
            # The admin's job list sorted by finish time, within a queue or a state (finished
            # rows only: admin/listing.py reads the unfinished ones apart, by creation time).
            models.Index(
                fields=["queue", "finished_at", "id"], name="jobq_job_q_done_id",
                condition=models.Q(finished_at__isnull=False),
            ),
            models.Index(
                fields=["state", "finished_at", "id"], name="jobq_job_state_done_id",
                condition=models.Q(finished_at__isnull=False),
            ),
        ]  # fmt: skip
        ordering = ["-created_at"]
        # Admin actions that change what a job does next, granted apart from "change".
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("retry_job", "Can retry and requeue jobs"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} ({self.state})"


class JobEvent(models.Model):
    """One transition of one job: the history the timeline and the analytics read."""

    # No index of its own: (job, at) below serves every lookup by job, one index less to
    # write per event. No database constraint either (migration 0023): its check locked the
    # job row of every new event (``FOR KEY SHARE``, a WAL record each), a fifth of a bulk
    # enqueue's database time, to guard what the writers already ensure. Every event is
    # written for a row its transaction just inserted or holds locked, and every delete of
    # job rows takes their events too: Django's cascade for ORM deletes (``on_delete`` is
    # applied by Django, not by the database), the raw deletes after their jobs (see
    # ``DatabaseCore._delete_rows``).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    queue = models.CharField(max_length=64)  # denormalised: per-queue history without a join
    kind = models.CharField(max_length=16)
    at = models.DateTimeField()
    worker = models.CharField(max_length=128, blank=True, default="")
    detail = models.JSONField(null=True, blank=True)
    # Stream id of the Redis event this row mirrors (idempotent re-delivery); "" for database.
    stream_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        constraints = [
            # A re-delivered stream event (mirror restart before its ack) is written once.
            models.UniqueConstraint(
                fields=["queue", "stream_id"],
                condition=~models.Q(stream_id=""),
                name="jobq_event_stream_uniq",
            )
        ]
        indexes = [
            models.Index(fields=["job", "at"], name="jobq_event_job_at"),
            models.Index(fields=["at"], name="jobq_event_at"),
            models.Index(fields=["queue", "id"], name="jobq_event_queue"),
        ]
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


class StateCount(models.Model):
    """How many job rows each (queue, state) holds (database backend), kept by triggers on
    the job table (migration 0031) in the writing transaction, so a count is a read of a few
    rows where ``COUNT(*)`` visited every row of the state (200,000 waiting and dead rows of a
    million-row table: 100 ms and more per overview). Triggers, not code beside each
    transition: every write of a job row counts, the ORM's, raw SQL's, the mirror's.

    ``slot``: on PostgreSQL the writing backend's process id × 16 plus a random 0-15, so
    concurrent writers add to rows of their own and never wait on each other's (nor
    deadlock), and an old snapshot held somewhere lengthens 16 version chains a backend, not
    one (migration 0031); the reaper folds the slots of backends gone into slot 0
    (``DatabaseStorage.fold_counts``). SQLite has one writer at a time: slot 0 only. A count
    is the sum of its slots."""

    queue = models.CharField(max_length=64)
    state = models.CharField(max_length=16)
    slot = models.IntegerField(default=0)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "state", "slot"], name="jobq_statecount_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.state}: {self.n} (slot {self.slot})"


class JobOutcome(models.Model):
    """The outcome ledger of ``atomic=True`` handlers on the Redis backend: written in the
    handler's own transaction (``worker/execution.py``), so it exists exactly when the
    handler's writes committed. A redelivered job whose row exists (its worker died after the
    commit, before Redis heard of it) is acknowledged with the stored result, not run again.

    One row per job *record*: ``created_ms`` is the record's creation time and ``digest``
    its payload's, so a job id enqueued again after its record went (expired, purged) runs
    anew, also within the same millisecond (the ledger's model test found that case) unless
    its payload is the same too. The unique key also
    decides between two runs of one job committing at once (a lease taken over): the second
    insert fails and its transaction, writes included, rolls back. Rows end with the job's
    result TTL (the reaper deletes them)."""

    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=160)
    created_ms = models.BigIntegerField()
    digest = models.CharField(max_length=32)  # of the payload: blake2b, 16 bytes, hex
    result = models.BinaryField()
    # The jobs the handler enqueued with ``enqueue_on_commit`` (queue, id, payload, options,
    # as the journal encodes them): sent after the commit and again by a run that finds the
    # outcome (the id deduplicates), so the follow-ups exist exactly when the job completed.
    follow_ups = models.JSONField(default=list, blank=True)
    recorded_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "job_id", "created_ms", "digest"],
                name="jobq_outcome_record_uniq",
            )
        ]
        indexes = [models.Index(fields=["expires_at"], name="jobq_outcome_expires")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} outcome"


class EventFloor(models.Model):
    """Per queue (database backend), the newest event id deleted so far, with its job
    (retention, expiry, purge, obliterate): a feed reader positioned before it may have lost
    events, and is told so (``EventsLost``) instead of reading on past the gap. Kept when the
    queue is obliterated, so a reader of the old queue is told too."""

    queue = models.CharField(max_length=64, primary_key=True)
    gone = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.queue}: events up to {self.gone} may be gone"


class WorkerInfo(models.Model):
    worker_id = models.CharField(max_length=128, unique=True)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    jobs_done = models.PositiveBigIntegerField(default=0)
    jobs_failed = models.PositiveBigIntegerField(default=0)
    info = models.JSONField(default=dict, blank=True)
    # An operator's command not taken yet (``Storage.send_worker_command``): beside ``info``,
    # which every heartbeat rewrites.
    command = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.worker_id


class QueueConfig(models.Model):
    name = models.CharField(max_length=64, unique=True)
    paused = models.BooleanField(default=False)
    defaults = models.JSONField(default=dict, blank=True)  # job option overrides
    created_at = models.DateTimeField(auto_now_add=True)
    # Flow control (``QueueLimits``; None: no limit), enforced by the database backend's claim.
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate_max = models.PositiveIntegerField(null=True, blank=True)
    rate_window = models.PositiveIntegerField(null=True, blank=True)  # ms
    group_rate_max = models.PositiveIntegerField(null=True, blank=True)
    group_rate_window = models.PositiveIntegerField(null=True, blank=True)  # ms
    # A handler said the upstream service is limited for the whole queue: no claims until then.
    postponed_until = models.DateTimeField(null=True, blank=True)
    # Permanent failures record a FailureCall (set by workers whose handler has a failure
    # handler). A database default too: the mirror and raw SQL may insert rows without it.
    failure_hook = models.BooleanField(default=False, db_default=False)
    # Retention of finished jobs (``Retention``; None: none), applied by the database
    # backend's reaper pass: {"completed": {"count": n, "age": ms}, ...}.
    retention = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "queue"

    def __str__(self) -> str:
        return self.name


class DedupKey(models.Model):
    """A deduplication key of one queue and the job that holds it (database backend).

    The row is also the lock that serialises concurrent enqueues of one key. ``job`` None or
    deleted (cascade): the key is free."""

    queue = models.CharField(max_length=64)
    key = models.CharField(max_length=128, db_column="dedup_key")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    mode = models.CharField(max_length=16, default="simple")
    held_until = models.DateTimeField(null=True, blank=True)  # None: until the holder finishes

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "key"], name="jobq_dedup_queue_key_uniq")
        ]
        verbose_name = "deduplication key"

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}"


class ClaimLog(models.Model):
    """When jobs of a rate-limited queue started: the sliding windows of ``QueueLimits`` count
    these (database backend). Written only while the queue has a rate limit; pruned by claims."""

    queue = models.CharField(max_length=64)
    group = models.CharField(max_length=128, blank=True, default="", db_column="job_group")
    at = models.BigIntegerField()  # epoch ms by the storage clock

    class Meta:
        indexes = [
            models.Index(fields=["queue", "at"], name="jobq_claimlog_queue_at"),
            models.Index(fields=["queue", "group", "at"], name="jobq_claimlog_group_at"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.group} at {self.at}"


class FailureCall(models.Model):
    """A pending call of a queue's failure handler (database backend), written in the same
    transaction that failed the job for good, with its own copy of what the handler needs so
    it outlives the job row's ``result_ttl`` and a successor taking the id over. Deleted once
    the failure handler succeeded; until then leased (``due_at`` = lease end) and backed off."""

    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=160)
    payload = models.BinaryField(default=b"")
    content_type = models.CharField(max_length=16, default="json")
    error = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    failed_at = models.DateTimeField()
    due_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)  # claims so far: the settle's fence
    last_error = models.JSONField(null=True, blank=True)  # the failure handler's own
    worker = models.CharField(max_length=128, blank=True, default="")  # last claimed by

    class Meta:
        indexes = [models.Index(fields=["queue", "due_at"], name="jobq_failcall_due")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} failure call ({self.tries} tries)"


class JournalEntry(models.Model):
    """An accepted job of a queue in ``durability="journal"`` mode (``journal.py``).

    Written in the producer's transaction when one is open, so the job is accepted exactly when
    the producer's rows are; ``jobq_reconcile`` re-creates in Redis every entry whose job Redis
    no longer knows and deletes entries whose job Redis reports finished. The entry carries what
    re-creating the job exactly needs: payload bytes, content type and every enqueue option.
    """

    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=128)
    payload = models.BinaryField()
    content_type = models.CharField(max_length=16, default="json")
    # JobOptions and the scheduling options as JSON (journal.encode_options); a ``delay`` is
    # stored as the absolute due time, so a job re-created later keeps its original due time.
    options = models.JSONField()
    created_ms = models.BigIntegerField()  # epoch ms of the (latest) accepted enqueue

    class Meta:
        verbose_name_plural = "journal entries"
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_id"], name="jobq_journal_queue_job")
        ]
        # Reconcile walks one queue's entries in primary-key order, a batch at a time.
        indexes = [models.Index(fields=["queue", "id"], name="jobq_journal_queue_id")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id}"
