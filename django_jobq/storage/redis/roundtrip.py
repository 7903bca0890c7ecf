"""Request/response at the round-trip limit: two blocking reads that carry a second command
behind them on the same connection, so that Redis runs it the moment the first answers.

- ``enqueue_and_wait``: the enqueue script and the BLPOP of the job's reply list go out in one
  write. Redis runs the script (which registers the waiter), then blocks the BLPOP: the caller
  pays one send, and the result arrives when the job is done (the finishing script pushes it).
- ``wait_and_claim``: an idle worker's BLPOP on its wake lists and its claim script go out in
  one write. A wake-up ends the BLPOP and the server runs the claim at once, so the claimed
  jobs come back with the wake-up instead of a round trip after it. The claim is the ordinary
  ``claim.lua`` (atomic, leased, fenced): a worker that dies after it leaves leased jobs
  that the reaper recovers, exactly as after a claim sent on its own.

Both fall back to the two-call path (``None``) where they cannot apply: a cluster client (no
single pool; the keys still share a slot, but the node connection is the cluster layer's),
a job that is not plain (``RedisStorage._packed_one``), or scripts flushed from the server.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from ...job import FinalOutcome, NewJob, StoredEnqueue
from ...states import TERMINAL_STATES, JobState
from .connection import COMMAND_TIMEOUT, MAX_BLOCK_SECONDS, _read_response, pooled_connection
from .scripts import keep_head, script_head

if TYPE_CHECKING:
    from ..base import ClaimBatch
    from .storage import RedisStorage

# Answers of enqueue_one after which no waiter was registered, so no reply will come.
_NOT_WAITED = TERMINAL_STATES | {JobState.BLOCKED}


def outcome(message: bytes) -> FinalOutcome:
    """A reply-list message ``state\\nbody`` (``finish`` in common.lua) as an outcome."""
    state, _, body = message.partition(b"\n")
    st = JobState(state.decode())
    return FinalOutcome(
        st, body if st is JobState.COMPLETED else None, body if st is JobState.FAILED else None
    )


def enqueue_and_wait(
    storage: RedisStorage, queue: str, job: NewJob, timeout: float
) -> tuple[StoredEnqueue, FinalOutcome | None] | None:
    """Enqueue and wait in one write; None when this path does not apply (nothing was sent)."""
    pool = getattr(storage.client, "connection_pool", None)
    if pool is None or timeout <= 0:
        return None
    packed = storage._packed_one(queue, job)
    if packed is None:
        return None
    deadline = time.monotonic() + timeout
    wait = min(timeout, MAX_BLOCK_SECONDS)
    scripts = storage.scripts
    conn = scripts.take(pool)  # given back below after its last reply, or disconnected
    try:
        # One bytes object, so one write and one segment: redis-py writes each item of a
        # list with its own sendall (a system call each; alone, no difference that showed
        # in request/response on the 2-core VM, but nothing to pay for either).
        conn.send_packed_command((packed + b"".join(conn.pack_command(
            "BLPOP", storage.keys(queue).done(job.job_id), wait)),))  # fmt: skip
        try:
            stored = storage._parse_enqueue([job], conn.read_response())[0]
        except ResponseError as exc:
            conn.disconnect()  # the BLPOP behind the failed script still blocks: drop it
            if isinstance(exc, NoScriptError):
                return None  # the enqueue did not run; the ordinary path loads the scripts
            raise
        if stored.state in _NOT_WAITED:
            # A finished duplicate answers now (no reply will be pushed for it): ending the
            # connection ends the BLPOP queued behind it on the server.
            conn.disconnect()
            if stored.state is JobState.BLOCKED:
                return stored, storage._outcome_by(queue, job.job_id, deadline)
            return stored, None
        try:
            popped = _read_response(conn, wait + COMMAND_TIMEOUT)
        except ConnectionError:
            # Enqueued and registered: a new BLPOP on another connection gets the reply.
            conn.disconnect()
            return stored, storage._outcome_by(queue, job.job_id, deadline)
    except ConnectionError:
        conn.disconnect()
        return None  # refused or reset before the enqueue's answer: the ordinary path retries
    except BaseException:
        conn.disconnect()  # a reply may be left unread: never reuse this connection
        raise
    finally:
        scripts.give(pool, conn)
    if popped:
        return stored, outcome(popped[1])
    return stored, storage._outcome_by(queue, job.job_id, deadline)


def wait_and_claim(
    storage: RedisStorage, queue: str, worker_id: str, count: int, lease_ms: int, timeout: float
) -> ClaimBatch | None:
    """BLPOP on the queue's wake list and the worker's own, with the claim written behind it;
    None when this path does not apply or the claim was refused with NOSCRIPT (the wait
    happened; the caller's own claim reloads the scripts)."""
    pool = getattr(storage.client, "connection_pool", None)
    if pool is None:
        storage.wait_for_jobs([queue], timeout, worker_id)
        return None
    timeout = min(max(timeout, 0.001), MAX_BLOCK_SECONDS)  # BLPOP 0 would block for ever
    scripts = storage.scripts
    for attempt in (1, 2):
        # A kept connection first (see Scripts.take), a fresh one from the pool if it failed.
        conn = scripts.take(pool) if attempt == 1 else pooled_connection(pool, "BLPOP")
        try:
            head = wait_head(storage, conn, queue, worker_id, count, lease_ms, timeout)
            nonce = b"%d" % token_nonce()
            conn.send_packed_command((b"%s$%d\r\n%s\r\n" % (head, len(nonce), nonce),))
            _read_response(conn, timeout + COMMAND_TIMEOUT)  # the wake-up (or nil): the
            try:  # claim's answer says what there is
                raw: Any = conn.read_response()
            except NoScriptError:
                return None
            break
        except ConnectionError:
            conn.disconnect()  # a stale pooled connection: replaced once, as a command's is
            if attempt == 2:
                raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            scripts.give(pool, conn)
    return storage._parse_claim(queue, raw)


def token_nonce() -> int:
    """The claim's fencing-token nonce (``claim.lua``'s ARGV[8]): drawn per call, never kept.
    From ``random``, not ``secrets``: it only has to differ between two claims in the same
    microsecond of the server's clock (includes/common.lua), not be unguessable, and the
    system's generator costs a system call per draw on the idle worker's path. ``random``
    reseeds itself in a forked child, so forked workers do not draw the same nonces."""
    return random.randrange(1000)  # noqa: S311 - a tie-breaker, not a secret


def wait_head(
    storage: RedisStorage,
    conn: Any,
    queue: str,
    worker_id: str,
    count: int,
    lease_ms: int,
    timeout: float,
) -> bytes:
    """The ``BLPOP`` and the claim behind it in the wire format, all but the claim's last
    argument (the token nonce, drawn per call), kept per queue, worker, count, lease and
    timeout (not with an injected clock: its ``now`` is an argument). Why: redis-py packs
    the ~25 arguments in more client time than the rest of the re-arm, and an idle worker
    re-arms after every job. Packed by redis-py once (its encoding of each argument, the
    timeout's float included), from ``_claim_call``, the one definition of the claim's
    arguments."""
    key = (queue, worker_id, count, lease_ms, timeout)
    head = storage._wait_heads.get(key)
    if head is None:
        k = storage.keys(queue)
        keys, args = storage._claim_call(queue, worker_id, count, lease_ms)
        keys.append(k.worker_wake(worker_id))  # KEYS[12]: claim nothing when stopping
        blpop = b"".join(conn.pack_command("BLPOP", k.wake, k.worker_wake(worker_id), timeout))
        head = blpop + script_head("claim", keys, args[:-1], 1)  # the nonce: packed per call
        if storage.clock is not None:  # an injected clock's ``now`` is in it: never kept
            return head
        keep_head(storage._wait_heads, key, head)
    return head
