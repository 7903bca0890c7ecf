"""The job state machine, defined once for every backend, the models and the docs: the states,
the transitions every backend may make, and the constants and error texts the three
implementations of those transitions share (memory, the database, the Lua scripts)."""

from django.db.models import TextChoices


class JobState(TextChoices):
    # Waiting for its run_at (a delayed job); the reaper or a claim promotes it when due.
    SCHEDULED = "scheduled", "Scheduled"
    # Runnable now; a worker's claim moves it to active.
    QUEUED = "queued", "Queued"
    # Leased by one worker until its lease deadline; heartbeats extend the lease.
    ACTIVE = "active", "Active"
    # Finished successfully; the result is kept for result_ttl, then the record expires.
    COMPLETED = "completed", "Completed"
    # Finished for good (permanent error, attempts or stalls exhausted); error kept for result_ttl.
    FAILED = "failed", "Failed"
    # Failed an attempt and waits for its backoff; it is scheduled again, with a retry_at.
    RETRYING = "retrying", "Retrying"
    # Cancelled before it ran; it never runs, and its id stays deduplicated until it expires.
    CANCELLED = "cancelled", "Cancelled"
    # Singleton successor: its id is active; it takes over the id when that run finishes.
    BLOCKED = "blocked", "Blocked"
    # A mirror row only (storage never holds it): the job was accepted, and Redis lost it
    # before it finished (a restart or flush without the journal). The row keeps what was
    # known; nothing will run it. No transition leads here: the mirror writes it (mirror/core.py).
    LOST = "lost", "Lost"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
WAITING_STATES = frozenset(
    {JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING, JobState.BLOCKED}
)

# Allowed transitions: (from, to). Every backend implements exactly these; the model test
# (tests/model/) checks that every transition it sees a backend make is one of them.
TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.SCHEDULED, JobState.QUEUED),  # due (promote), or due time moved to now
        (JobState.SCHEDULED, JobState.SCHEDULED),  # due time moved (change, update, debounce)
        (JobState.SCHEDULED, JobState.CANCELLED),
        (JobState.QUEUED, JobState.ACTIVE),  # claim
        (JobState.QUEUED, JobState.SCHEDULED),  # due time moved later; group over its budget
        (JobState.QUEUED, JobState.CANCELLED),
        (JobState.ACTIVE, JobState.COMPLETED),  # complete (lease owner only)
        (JobState.ACTIVE, JobState.FAILED),  # permanent error / attempts or stalls exhausted
        (JobState.ACTIVE, JobState.RETRYING),  # failed attempt, backoff pending
        (JobState.ACTIVE, JobState.QUEUED),  # stalled lease reclaimed, or released on shutdown
        # The handler postponed itself (rate limited); or, like ACTIVE -> QUEUED, a singleton
        # successor took over the id of a run that finished, due later.
        (JobState.ACTIVE, JobState.SCHEDULED),
        (JobState.ACTIVE, JobState.CANCELLED),  # a running job's cancel, ended by its worker
        (JobState.RETRYING, JobState.QUEUED),  # backoff due (promote), or moved to now
        (JobState.RETRYING, JobState.RETRYING),  # due time moved (change, update)
        (JobState.RETRYING, JobState.CANCELLED),
        # A singleton successor is released when the run of its id finishes, or cancelled.
        (JobState.BLOCKED, JobState.QUEUED),
        (JobState.BLOCKED, JobState.SCHEDULED),
        (JobState.BLOCKED, JobState.CANCELLED),
        # An operator's retry: from attempt 1, in the job's old place in line.
        (JobState.FAILED, JobState.QUEUED),
        (JobState.CANCELLED, JobState.QUEUED),
    }
)


def can_transition(src: JobState | str, dst: JobState | str) -> bool:
    return (JobState(src), JobState(dst)) in TRANSITIONS


# -- what the three implementations share -------------------------------------------------------
# One value each. The memory and database backends read them here; the Lua scripts get them as
# arguments or from the include ``--@include spec``, which the script loader generates from
# ``LUA_SPEC`` (storage/redis/scripts.py): no script spells one out itself.

#: With group rate limits, a claim looks at no more than this many queued candidates beyond its
#: count: candidates of groups that spent their budget move to scheduled, so a later claim
#: (woken by this one) looks further.
GROUP_SCAN = 100
#: Due scheduled and retrying jobs one claim or reap promotes to queued.
PROMOTE_LIMIT = 1000
#: The error record of a job whose lease expired more than ``max_stalls`` times.
STALLED_ERROR = b'{"type":"Stalled","message":"lease expired more than max_stalls times"}'
#: The error record of a broadcast delivery whose lease lapsed more often than it may.
DELIVERY_STALLED_ERROR = b'{"type":"Stalled","message":"lease lapsed too often"}'

#: The names the include ``spec`` defines as Lua locals.
LUA_SPEC = {
    "GROUP_SCAN": GROUP_SCAN,
    "PROMOTE_LIMIT": PROMOTE_LIMIT,
    "STALLED_ERROR": STALLED_ERROR.decode(),
    "DELIVERY_STALLED_ERROR": DELIVERY_STALLED_ERROR.decode(),
}
