"""The job state machine, defined once for every backend, the models and the docs."""

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
    # Singleton: same id already active; runnable once the active one finishes (scheduling issue).
    BLOCKED = "blocked", "Blocked"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
WAITING_STATES = frozenset(
    {JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING, JobState.BLOCKED}
)

# Allowed transitions: (from, to). Every backend implements exactly these; the contract suite
# checks that a job only ever moves along one of them.
TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.SCHEDULED, JobState.QUEUED),  # due (promote)
        (JobState.SCHEDULED, JobState.CANCELLED),
        (JobState.QUEUED, JobState.ACTIVE),  # claim
        (JobState.QUEUED, JobState.CANCELLED),
        (JobState.ACTIVE, JobState.COMPLETED),  # complete (lease owner only)
        (JobState.ACTIVE, JobState.FAILED),  # permanent error / attempts or stalls exhausted
        (JobState.ACTIVE, JobState.RETRYING),  # failed attempt, backoff pending
        (JobState.ACTIVE, JobState.QUEUED),  # stalled lease reclaimed, or released on shutdown
        (JobState.RETRYING, JobState.QUEUED),  # backoff due (promote)
        (JobState.RETRYING, JobState.CANCELLED),
        (JobState.BLOCKED, JobState.QUEUED),
        (JobState.BLOCKED, JobState.CANCELLED),
    }
)


def can_transition(src: JobState | str, dst: JobState | str) -> bool:
    return (JobState(src), JobState(dst)) in TRANSITIONS
