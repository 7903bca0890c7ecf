"""Redis backend: every transition is one Lua script (``lua/``), one round trip."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import EventsLost, QueueBusy, StorageFull, StorageUnavailable
from ...job import (
    LOG_LINES,
    PARKED_FLOOR,
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    ClaimedJob,
    EnqueueOutcome,
    Event,
    FailureCall,
    FinalOutcome,
    JobRecord,
    Keep,
    NewJob,
    QueueLimits,
    Retention,
    RetryOutcome,
    RunAtUpdate,
    StoredEnqueue,
    event_data,
    final_outcome,
)
from ...states import GROUP_SCAN, PROMOTE_LIMIT, TERMINAL_STATES, JobState
from ..base import Ack, ClaimBatch, Clock, QueueSummary, ReapReport, Storage, WorkerRecord
from . import aio, roundtrip
from .builders import positional_builder
from .connection import MAX_BLOCK_SECONDS, blocking_command
from .keys import GlobalKeys, QueueKeys
from .scripts import Scripts, keep_head, resp, script_head

_ENQUEUE_CODES = {
    1: EnqueueOutcome.QUEUED,
    2: EnqueueOutcome.DUPLICATE,
    3: EnqueueOutcome.COMPLETED,
    4: EnqueueOutcome.UPDATED,
}
# A state as the scripts return it (bytes) -> JobState: a dict read instead of the enum's
# constructor (a lone enqueue parses one state per call; bulk enqueues one per job).
_STATES: dict[bytes | str, JobState] = {
    **{state.value.encode(): state for state in JobState},
    **{state.value: state for state in JobState},
}


_FAIL_CODES = {
    0: AckOutcome.LEASE_LOST, 2: AckOutcome.FAILED, 3: AckOutcome.RETRYING,
    4: AckOutcome.CANCELLED,
}  # fmt: skip
_ACK_DONE = {
    "complete": AckOutcome.COMPLETED,
    "release": AckOutcome.RELEASED,
    "postpone": AckOutcome.POSTPONED,
}
_LIMIT_FIELDS = ("rate_max", "rate_window", "group_rate_max", "group_rate_window", "concurrency")
_RETAIN_STATES = ("completed", "failed", "cancelled")
_UPDATE_FLAGS = (("data", "d"), ("max_attempts", "m"), ("backoff", "b"), ("reset_counts", "c"))
ACK_CHUNK = 500  # completions per complete_many script call
# Jobs per enqueue script call in bulk: small enough that Redis runs one call while the client
# packs the next (see Scripts.call_streamed), and bounds how long one call blocks Redis.
ENQUEUE_CHUNK = 100
SUMMARY_CHUNK = 500  # queues per pipeline of queue_summaries (metrics, listings)
# Concurrent single enqueues combined into one call at most (see _Combiner).
COMBINE_MAX = 100
# Calls per queue on the wire at once before further callers are combined. Measured with
# bench.core's producer threads: combining below 3 threads is slower than overlapping calls.
COMBINE_AFTER = 2
DRAIN_CHUNK = 1000  # jobs cancelled per drain script call (one call blocks Redis that long)
RECORDS_CHUNK = 500  # records per script call of get_records (one call blocks Redis that long)
SCAN_CHUNK = 1000  # keys per SCAN step and per clean / obliterate call


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_s(value: bytes | str | None) -> str | None:
    return None if value is None else _s(value)


def _counts(replies: Sequence[Any]) -> dict[JobState, int]:
    """``counts`` from its five reads: the queued, active and scheduled ZCARDs, the blocked
    SCARD and the stats HMGET (retrying jobs sit in the scheduled set too)."""
    queued, active, scheduled, blocked, (retrying, completed, failed, cancelled) = replies
    retrying = _i(retrying)
    return {
        JobState.SCHEDULED: scheduled - retrying,
        JobState.QUEUED: queued,
        JobState.ACTIVE: active,
        JobState.RETRYING: retrying,
        JobState.BLOCKED: blocked,
        JobState.COMPLETED: _i(completed),
        JobState.FAILED: _i(failed),
        JobState.CANCELLED: _i(cancelled),
    }


def _i(value: bytes | str | None) -> int:
    return 0 if value in (None, b"", "") else int(value)  # type: ignore[arg-type]


def _opt_i(value: bytes | str | None) -> int | None:
    return None if value in (None, b"", "") else int(value)  # type: ignore[arg-type]


#: The record fields ``get_records`` asks for (records.lua HMGETs them in this order).
RECORD_FIELDS = (
    "state", "attempts", "max_attempts", "stalls", "max_stalls", "priority", "created",
    "run_at", "started", "finished", "worker", "result_ttl", "ctype", "payload", "result",
    "error", "lifo", "group", "dedup", "min_backoff", "max_backoff", "succ", "progress", "logs",
)  # fmt: skip
RECORD_ARGS = (len(RECORD_FIELDS), *RECORD_FIELDS)


def _record(queue: str, job_id: str, raw: dict, pttl: int, now: int) -> JobRecord | None:
    if not raw:
        return None
    f = {_s(key): value for key, value in raw.items()}
    return _record_values(queue, job_id, [f.get(name) for name in RECORD_FIELDS], pttl, now)


#: A record and an event built by position (builders.py: a third of a frozen init's time).
_build_record = positional_builder(JobRecord)
_build_event = positional_builder(Event)


def _record_values(
    queue: str, job_id: str, values: Sequence[Any], pttl: int, now: int
) -> JobRecord | None:
    """A record from its ``RECORD_FIELDS`` values (None where a field is absent): no field
    names to decode, which was most of the cost of reading records for the mirror. Numbers
    are read as ``_i`` and ``_opt_i`` read them (absent or empty: 0 or None), inline."""
    (state, attempts, max_attempts, stalls, max_stalls, priority, created, run_at, started,
     finished, worker, result_ttl, ctype, payload, result, error, lifo, group, dedup,
     min_backoff, max_backoff, succ, progress, logs) = values  # fmt: skip
    if state is None:  # every record has a state: the key is gone
        return None
    return _build_record(
        queue, job_id, _STATES.get(state) or JobState(_s(state)),
        int(attempts) if attempts else 0, int(max_attempts) if max_attempts else 0,
        int(stalls) if stalls else 0, int(max_stalls) if max_stalls else 0,
        int(priority) if priority else 0, int(created) if created else 0,
        int(run_at) if run_at else None, int(started) if started else None,
        int(finished) if finished else None, _opt_s(worker),
        int(result_ttl) if result_ttl else 0, _opt_s(ctype) or "json", payload, result, error,
        now + pttl if pttl and pttl > 0 else None, lifo in (b"1", "1"), _opt_s(group),
        _opt_s(dedup), int(min_backoff) if min_backoff else 0,
        int(max_backoff) if max_backoff else 0, succ in (b"1", "1"), progress,
        tuple((int(at), str(line)) for at, line in json.loads(logs)) if logs else (),
    )  # fmt: skip


_CALL_FIELDS = (
    "id", "payload", "ctype", "error", "attempts", "failed", "tries", "last_error", "worker",
)  # fmt: skip


def _failure_call(queue: str, f: Sequence[Any]) -> FailureCall:
    """From (member, id, payload, ctype, error, attempts, failed, due, tries, last_error,
    worker)."""
    return FailureCall(
        queue, _s(f[0]), _s(f[1]), f[2] or b"", _opt_s(f[3]) or "json", f[4] or b"", _i(f[5]),
        _i(f[6]), int(f[7]), _i(f[8]), f[9] or None, _opt_s(f[10]) or None,
    )  # fmt: skip


def _event(queue: str, event_id: bytes | str, fields: dict) -> Event:
    """An entry as an ``Event``. Entries are written by our scripts, but a stream is a plain
    key anyone may XADD to: a malformed entry (no job, an ``at`` that is not a number, bytes
    that are not UTF-8) becomes an event with what could be read (``at`` from the entry id,
    a missing job as ""), so that one bad entry never makes every read of the stream fail."""
    try:
        if isinstance(event_id, bytes):  # the client's usual replies: read bytes keys directly
            worker, kind = fields.get(b"worker"), fields[b"kind"].decode()
            ct = fields.get(b"ct")
            return Event(
                event_id.decode(), queue, fields[b"job"].decode(), kind,
                int(fields[b"at"]), None if worker is None else worker.decode(),
                event_data(kind, fields.get(b"data"), ct.decode() if ct else "json"),
                b"omitted" in fields,
            )  # fmt: skip
        f = {_s(a): _s(b) for a, b in fields.items()}
        raw = f.get("data")
        return Event(
            _s(event_id), queue, f["job"], f["kind"], int(f["at"]), f.get("worker"),
            event_data(f["kind"], None if raw is None else raw.encode(), f.get("ct", "json")),
            "omitted" in f,
        )  # fmt: skip
    except (KeyError, ValueError, AttributeError):  # UnicodeDecodeError is a ValueError
        return _odd_event(queue, event_id, fields)


def _flat_event(queue: str, event_id: bytes | str, fields: Any) -> Event:
    """An entry from its fields as the server sent them (``[name, value, ...]``). The entries
    our scripts write (job, kind, at[, worker], in that order: includes/common.lua ``emit``)
    are read by position; any other shape goes through ``_event``."""
    n = len(fields) if isinstance(fields, list) else 0
    if (
        (n == 6 or (n == 8 and fields[6] == b"worker"))
        and fields[0] == b"job" and fields[2] == b"kind" and fields[4] == b"at"
        and isinstance(event_id, bytes)
    ):  # fmt: skip
        try:
            return _build_event(
                event_id.decode(), queue, fields[1].decode(), fields[3].decode(),
                int(fields[5]), fields[7].decode() if n == 8 else None, None, False,
            )  # fmt: skip
        except (ValueError, AttributeError):  # not UTF-8, not a number: read as far as it goes
            pass
    if isinstance(fields, list):
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    return _event(queue, event_id, fields)


def _odd_event(queue: str, event_id: bytes | str, fields: dict) -> Event:
    def text(value: bytes | str) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    f = {text(a): text(b) for a, b in fields.items()}
    eid = text(event_id)
    try:
        at = int(f["at"])
    except (KeyError, ValueError):
        at = _stream_id(eid)[0]
    return Event(eid, queue, f.get("job", ""), f.get("kind", ""), at, f.get("worker"))


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _scheduling_set(job: NewJob) -> tuple:
    """The enqueue script's scheduling set of a job that uses lifo, group, singleton, update or
    dedup (see enqueue.lua); the leading marker keeps it apart from option sets in the call's
    set table and is not sent."""
    update, dedup = job.update, job.dedup
    flags = mode = ""
    if update is not None:
        flags = "".join(letter for name, letter in _UPDATE_FLAGS if getattr(update, name))
        mode = "" if update.run_at is RunAtUpdate.NO else update.run_at.value
    return (
        "x", "1" if job.lifo else "", "1" if job.singleton else "", flags, mode,
        job.group or "", dedup.key if dedup else "", dedup.mode.value if dedup else "",
        (dedup.ttl or 0) if dedup else 0, "", "",
    )  # fmt: skip


class _Slot:
    """One caller's job in the enqueue combiner; the event exists only for a caller that waits."""

    __slots__ = ("job", "result", "error", "event", "batch", "done")

    def __init__(self, job: NewJob) -> None:
        self.job = job
        self.result: StoredEnqueue | None = None
        self.error: BaseException | None = None
        self.event: threading.Event | None = None
        self.batch: list[_Slot] | None = None
        self.done = False


class _Combiner:
    """Group commit for concurrent ``enqueue`` calls of one queue in one process.

    Up to ``COMBINE_AFTER`` script calls per queue may be on the wire from this process, one
    per caller, as without a combiner (a few threads overlap their round trips on separate
    connections, which is faster than sharing one). A caller that finds them all in flight parks
    its job; the caller whose call returns hands the parked jobs (up to ``COMBINE_MAX``) to the
    first of them, which runs them as one call. Each thread makes at most one call, for its own
    batch, so a parked job waits at most for one call ahead of it, and many parked jobs share
    one round trip instead of taking turns for connections. Jobs of one call are processed in
    order by the same script as ``enqueue_many``, so the results are those of the same calls
    made one after another."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.parked: list[_Slot] = []

    def join(self, slot: _Slot) -> list[_Slot] | None:
        with self.lock:
            if self.in_flight < COMBINE_AFTER:
                self.in_flight += 1
                return [slot]
            slot.event = threading.Event()
            self.parked.append(slot)
            return None

    def hand_over(self) -> None:
        with self.lock:
            if not self.parked:
                self.in_flight -= 1
                return
            batch = self.parked[:COMBINE_MAX]
            del self.parked[:COMBINE_MAX]
            batch[0].batch = batch
        batch[0].event.set()  # type: ignore[union-attr]

    def withdraw(self, slot: _Slot) -> list[_Slot] | None:
        """A parked caller interrupted while waiting (KeyboardInterrupt in the main thread):
        take its job back, or return the batch it was just handed, which it must still run
        or the other jobs in it would wait forever."""
        with self.lock:
            if slot in self.parked:
                self.parked.remove(slot)
                return None
            return slot.batch if not slot.done else None


class RedisStorage(Storage):
    supports_journal = True

    # The class that serves a ``RedisCluster`` client (``cluster.py`` registers itself
    # with ``serves_cluster=True``): ``RedisStorage(client)`` then builds the right variant for
    # any client, and this module needs no import of the variant.
    _cluster_class: type[RedisStorage] | None = None

    def __init_subclass__(cls, *, serves_cluster: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if serves_cluster:
            RedisStorage._cluster_class = cls

    def __new__(cls, client: Any, *args: Any, **kwargs: Any) -> RedisStorage:
        """A ``RedisCluster`` client (no single connection pool) gets the cluster variant,
        which splits the steps that span several queues' slots."""
        if cls is RedisStorage and not hasattr(client, "connection_pool"):
            assert RedisStorage._cluster_class is not None  # imported by the package
            return super().__new__(RedisStorage._cluster_class)
        return super().__new__(cls)

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "jobq",
        events_maxlen: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.events_maxlen = events_maxlen
        self.clock = clock
        self.scripts = Scripts(client)
        self.global_keys = GlobalKeys(prefix)
        self._keys: dict[str, QueueKeys] = {}
        self._settle: dict[str, list[str]] = {}
        self._combiners: dict[str, _Combiner] = {}
        self._heads: dict[tuple, bytes] = {}
        self._ack_heads: dict[str, bytes] = {}  # packed complete_many heads (_complete_one)
        self._wait_heads: dict[tuple, bytes] = {}  # packed wait-and-claim heads (roundtrip.py)

    def unavailable(self, exc: Exception) -> StorageUnavailable | None:
        """redis-py's errors of an unreachable server (refused, reset, timed out, still
        loading its data: BusyLoadingError is a ConnectionError) and of a full one."""
        from redis.exceptions import ConnectionError, OutOfMemoryError, TimeoutError

        if isinstance(exc, OutOfMemoryError):
            return StorageFull(f"Redis is full (maxmemory): {exc}")
        if isinstance(exc, ConnectionError | TimeoutError):
            return StorageUnavailable(f"Redis did not answer: {type(exc).__name__}: {exc}")
        return None

    def memory_info(self) -> dict[str, Any]:
        """The server's memory use and limit (``INFO memory``), for health reports."""
        info = self.client.info("memory")
        return {k: info.get(k) for k in ("used_memory", "used_memory_peak", "maxmemory",
                                         "maxmemory_policy")}  # fmt: skip

    def keys(self, queue: str) -> QueueKeys:
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = QueueKeys.for_queue(self.prefix, queue)
        return k

    def _settle_keys(self, queue: str) -> list[str]:
        """The keys a finished job's settling touches (settle_keys in common.lua, in order)."""
        s = self._settle.get(queue)
        if s is None:
            k = self.keys(queue)
            s = self._settle[queue] = [
                k.job_prefix, k.succ_prefix, k.dedup_prefix, k.blocked, k.queued, k.scheduled,
                k.wake, k.events,
            ]  # fmt: skip
        return s

    def _now_arg(self) -> int:
        return self.clock() if self.clock else 0  # 0: the script reads the server's TIME

    def _now(self) -> int:
        if self.clock:
            return self.clock()
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    # -- producer ---------------------------------------------------------------------------

    def _enqueue_call(self, queue: str, jobs: Sequence[NewJob]) -> tuple[str, list, list]:
        """Options shared by several jobs are sent once (see enqueue.lua): a bulk call of jobs
        with the queue's defaults packs three arguments a job instead of twelve. A job that
        uses the scheduling options (lifo, group, singleton, update, dedup) also names a
        scheduling set, so a plain job costs nothing more than before they existed."""
        k = self.keys(queue)
        sets: dict[tuple, int] = {}
        per_job: list[Any] = []
        for j in jobs:
            o = j.options
            key = (
                j.content_type, o.max_attempts, o.result_ttl, o.min_backoff, o.max_backoff,
                o.max_stalls, o.priority, j.run_at or 0, 1 if j.waiter else 0, j.delay,
            )  # fmt: skip
            number = sets.get(key)
            if number is None:
                number = sets[key] = len(sets) + 1
            if j.lifo or j.singleton or j.group is not None or j.update is not None or j.dedup:
                ext = _scheduling_set(j)
                ext_number = sets.get(ext)
                if ext_number is None:
                    ext_number = sets[ext] = len(sets) + 1
                per_job += [j.job_id, j.payload, f"{number}:{ext_number}"]
            else:
                per_job += [j.job_id, j.payload, number]
        args: list[Any] = [self._now_arg(), self.events_maxlen, len(sets)]
        for key in sets:
            args += key if len(key) == 10 else key[1:]
        args += per_job
        keys = [
            k.job_prefix, k.queued, k.scheduled, k.wake, k.seq, k.events, k.succ_prefix,
            k.dedup_prefix, k.blocked, k.stats,
        ]  # fmt: skip
        return "enqueue", keys, args

    @staticmethod
    def _parse_enqueue(jobs: Sequence[NewJob], raw: list) -> list[StoredEnqueue]:
        out = []
        pos = 0
        for job in jobs:
            code, state, result, error = raw[pos : pos + 4]
            pos += 4
            job_id = job.job_id
            if code > 10:  # answered by the job holding the dedup key: its id follows
                job_id = _s(raw[pos])
                pos += 1
                code -= 10
            out.append(
                StoredEnqueue(
                    _ENQUEUE_CODES[code], job_id, _STATES[state], result or None, error or None
                )
            )
        return out

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        """One job, one script call, unless other threads of this process are enqueueing to
        the same queue at the same moment: then the jobs that arrive while a call is on the
        wire go together in the next call (a group commit). A lone caller pays only an
        uncontended lock; concurrent callers share round trips instead of queueing for them
        one by one (see ``_Combiner``)."""
        combiner = self._combiners.get(queue)
        if combiner is None:
            combiner = self._combiners.setdefault(queue, _Combiner())
        slot = _Slot(job)
        batch = combiner.join(slot)
        while batch is None:  # a follower: a leader runs the call, or hands us the next batch
            try:
                slot.event.wait()  # type: ignore[union-attr]
            except BaseException:
                handed = combiner.withdraw(slot)
                if handed is not None:
                    self._run_batch(queue, handed)
                    combiner.hand_over()
                raise
            if slot.done:
                if slot.error is not None:
                    raise slot.error
                return slot.result  # type: ignore[return-value]
            batch = slot.batch
        self._run_batch(queue, batch)
        combiner.hand_over()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _packed_one(self, queue: str, job: NewJob) -> bytes | None:
        """The call of one plain job (no scheduling set) as wire bytes, or None when it is not
        plain or a clock is injected (its ``now`` changes every call). The script is
        ``enqueue_one``, enqueue's rules for such a job without its loop and set table, with
        the same arguments.

        Jobs of one queue with the same options share everything but their id and payload,
        so that head (the script's SHA, ten keys, the option set) is packed once per queue and
        option set and kept; a call then packs two arguments. ``_enqueue_call`` stays the one
        definition of the arguments: the head is cut from its output."""
        if (
            self.clock is not None or job.lifo or job.singleton or job.group is not None
            or job.update is not None or job.dedup is not None
        ):  # fmt: skip
            return None
        o = job.options
        key = (
            queue, job.content_type, o.max_attempts, o.result_ttl, o.min_backoff,
            o.max_backoff, o.max_stalls, o.priority, job.run_at or 0, job.waiter, job.delay,
        )  # fmt: skip
        head = self._heads.get(key)
        if head is None:
            _, keys, args = self._enqueue_call(queue, [job])
            try:  # the id, payload and waiter flag are packed per call
                head = keep_head(self._heads, key, script_head("enqueue_one", keys, args[:-3], 3))
            except TypeError:
                return None
        job_id, payload = job.job_id.encode(), job.payload
        if not isinstance(payload, bytes):
            return None
        return b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (
            head,
            len(job_id),
            job_id,
            len(payload),
            payload,
        )

    def _run_batch(self, queue: str, batch: list[_Slot]) -> None:
        jobs = [s.job for s in batch]
        try:
            packed = self._packed_one(queue, jobs[0]) if len(jobs) == 1 else None
            if packed is not None:
                raw = self.scripts.call_packed(
                    "enqueue_one", packed, lambda: self._enqueue_call(queue, jobs)[1:]
                )
            else:
                raw = self.scripts.call(*self._enqueue_call(queue, jobs))
            results = self._parse_enqueue(jobs, raw)
        except BaseException as exc:  # every job of the call shares its fate
            for s in batch:
                s.error = exc
        else:
            for s, result in zip(batch, results, strict=True):
                s.result = result
        for s in batch[1:]:  # batch[0] is the caller that ran it
            s.done = True
            s.event.set()  # type: ignore[union-attr]

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        chunks = [jobs[i : i + ENQUEUE_CHUNK] for i in range(0, len(jobs), ENQUEUE_CHUNK)]
        raws = self.scripts.call_streamed([self._enqueue_call(queue, c) for c in chunks])
        out: list[StoredEnqueue] = []
        for chunk, raw in zip(chunks, raws, strict=True):
            out += self._parse_enqueue(chunk, raw)
        return out

    # -- worker -----------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        return self._parse_claim(
            queue, self.scripts.call("claim", *self._claim_call(queue, worker_id, count, lease_ms))
        )

    def _claim_call(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> tuple[list[str], list[Any]]:
        k = self.keys(queue)
        return (
            [k.job_prefix, k.queued, k.scheduled, k.active, k.wake, k.events, k.stats, k.config,
             k.rate, k.group_rate_prefix, k.capped],
            [self._now_arg(), self.events_maxlen, worker_id, count, lease_ms, PROMOTE_LIMIT,
             GROUP_SCAN, roundtrip.token_nonce()],
        )  # fmt: skip

    @staticmethod
    def _parse_claim(queue: str, raw: list) -> ClaimBatch:
        batch = ClaimBatch(next_due_in=None if raw[0] == -1 else raw[0])
        for i in range(1, len(raw), 9):
            job_id, token, attempt, max_attempts, min_b, max_b, ctype, payload, waited = raw[
                i : i + 9
            ]
            ctype = _opt_s(ctype) or "json"
            batch.jobs.append(
                ClaimedJob(
                    queue,
                    _s(job_id),
                    payload,
                    int(token),
                    attempt,
                    max_attempts,
                    min_b,
                    max_b,
                    ctype,
                    waited,
                )  # fmt: skip
            )
        return batch

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        # BLPOP takes several keys only when they share a slot; in Redis Cluster run one worker
        # per queue. A timeout of 0 would block forever: never pass it.
        timeout = min(max(timeout, 0.001), MAX_BLOCK_SECONDS)
        keys = [self.keys(q).wake for q in queues]
        if worker_id is not None:
            keys.append(self.keys(queues[0]).worker_wake(worker_id))
        blocking_command(self.client, timeout, "BLPOP", *keys, timeout)

    def wait_and_claim(
        self, queue: str, worker_id: str, count: int, lease_ms: int, timeout: float
    ) -> ClaimBatch | None:
        return roundtrip.wait_and_claim(self, queue, worker_id, count, lease_ms, timeout)

    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        # Two markers: one ends the worker's BLPOP, the other tells the claim sent behind it
        # (wait_and_claim) to claim nothing. Both expire with the key.
        key = self.keys(queues[0]).worker_wake(worker_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(key, "1", "1")
        pipe.pexpire(key, 10_000)  # a worker that is gone must not leave it behind
        pipe.execute()

    def heartbeat(
        self, queue: str, worker_id: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[tuple[str, int]]:
        if not leases:
            return []
        k = self.keys(queue)
        args: list[Any] = [self._now_arg(), worker_id, lease_ms]
        for job_id, token in leases:
            args += [job_id, token]
        lost = self.scripts.call("heartbeat", [k.job_prefix, k.active], args)
        return [(_s(lost[i]), int(lost[i + 1])) for i in range(0, len(lost), 2)]

    def _ack_call(self, queue: str, ack: Ack) -> tuple[str, list, list]:
        k = self.keys(queue)
        head = [self._now_arg(), self.events_maxlen, ack.job_id, ack.token]
        if ack.kind == "complete":
            keys = [k.job(ack.job_id), k.active, k.stats, k.done(ack.job_id), k.capped]
            keys += [*self._settle_keys(queue), k.dead, k.config, k.finished_prefix]
            return "complete", keys, [*head, ack.body]
        if ack.kind in ("fail", "cancel"):
            keys = [k.job(ack.job_id), k.active, k.stats, k.done(ack.job_id), k.capped]
            cancel = ack.kind == "cancel"
            args = [*head, ack.body, ack.retry_in or 0, 1 if ack.permanent or cancel else 0,
                    "cancelled" if cancel else ""]  # fmt: skip
            keys += [*self._settle_keys(queue), k.dead, k.config, k.onfail, k.onfail_prefix]
            keys.append(k.finished_prefix)
            return "fail", keys, args
        if ack.kind == "postpone":
            keys = [k.job(ack.job_id), k.active, k.scheduled, k.wake, k.events, k.config]
            keys.append(k.capped)
            return "postpone", keys, [*head, ack.retry_in or 0, 1 if ack.queue_wide else 0]
        keys = [k.job(ack.job_id), k.active, k.queued, k.wake, k.events]
        return "release", keys, head

    @staticmethod
    def _parse_ack(kind: str, raw: int) -> AckOutcome:
        if kind in ("fail", "cancel"):
            return _FAIL_CODES[raw]
        if raw == 0:
            return AckOutcome.LEASE_LOST
        return _ACK_DONE[kind]

    def ack_many(self, queue: str, acks: Sequence[Ack]) -> list[AckOutcome]:
        """Completions go as ``complete_many`` calls of up to ACK_CHUNK jobs (one script call
        per chunk instead of one per job: the drain's main Redis and client cost); failures
        and releases as their own scripts; all in one pipelined round trip."""
        if len(acks) == 1 and acks[0].kind == "complete":
            return self._complete_one(queue, acks[0])
        completes = [i for i, a in enumerate(acks) if a.kind == "complete"]
        others = [i for i, a in enumerate(acks) if a.kind != "complete"]
        calls: list[tuple[str, list, list]] = []
        chunks = [completes[s : s + ACK_CHUNK] for s in range(0, len(completes), ACK_CHUNK)]
        for chunk in chunks:
            calls.append(("complete_many", *self._complete_call(queue, [acks[i] for i in chunk])))
        calls += [self._ack_call(queue, acks[i]) for i in others]
        raws = self.scripts.call_many(calls)
        out: list[AckOutcome | None] = [None] * len(acks)
        for chunk, raw in zip(chunks, raws, strict=False):
            for i, code in zip(chunk, raw, strict=True):
                out[i] = AckOutcome.COMPLETED if code == 1 else AckOutcome.LEASE_LOST
        for i, raw in zip(others, raws[len(chunks) :], strict=True):
            out[i] = self._parse_ack(acks[i].kind, raw)
        return out  # type: ignore[return-value]

    def _complete_call(self, queue: str, acks: Sequence[Ack]) -> tuple[list, list]:
        """Keys and arguments of one ``complete_many`` call (the one definition of both)."""
        k = self.keys(queue)
        args: list[Any] = [self._now_arg(), self.events_maxlen]
        for ack in acks:
            args += [ack.job_id, ack.token, ack.body]
        keys = [k.done_prefix, k.active, k.stats, k.capped, *self._settle_keys(queue),
                k.dead, k.config, k.finished_prefix]  # fmt: skip
        return keys, args

    def _complete_one(self, queue: str, ack: Ack) -> list[AckOutcome]:
        """A quiet worker's single completion (the request/response path), sent as bytes:
        the head of the call (SHA, keys, ``now`` and MAXLEN) is packed once per queue, as
        ``_packed_one`` does for enqueues, so only the job's three arguments are packed per
        call. With an injected clock (``now`` changes) or a body that is not bytes it goes
        the ordinary way."""
        head = self._ack_heads.get(queue)
        if head is None and self.clock is None:
            head = self._ack_head(queue)
        if head is None or not isinstance(ack.body, bytes):
            raw = self.scripts.call("complete_many", *self._complete_call(queue, [ack]))
        else:
            packed = b"%s%s%s%s" % (head, resp(ack.job_id), resp(ack.token), resp(ack.body))
            raw = self.scripts.call_packed(
                "complete_many", packed, lambda: self._complete_call(queue, [ack])
            )
        return [AckOutcome.COMPLETED if raw[0] == 1 else AckOutcome.LEASE_LOST]

    def _ack_head(self, queue: str) -> bytes:
        """Everything of a one-job ``complete_many`` call but the job's own three arguments,
        in the wire format; cut from ``_complete_call``'s output, the one definition."""
        keys, args = self._complete_call(queue, [])
        # The job's id, token and result are packed per call.
        return keep_head(self._ack_heads, queue, script_head("complete_many", keys, args, 3))

    def complete(self, queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:
        return self._ack(queue, Ack("complete", job_id, token, result))

    def fail(
        self,
        queue: str,
        job_id: str,
        token: int,
        error: bytes,
        *,
        retry_in: int | None = None,
        permanent: bool = False,
    ) -> AckOutcome:
        return self._ack(queue, Ack("fail", job_id, token, error, retry_in, permanent))

    def report(
        self,
        queue: str,
        job_id: str,
        token: int,
        *,
        progress: bytes | None = None,
        log: str | None = None,
    ) -> bool:
        k = self.keys(queue)
        args = [self._now_arg(), self.events_maxlen, job_id, token,
                b"" if progress is None else progress, "" if log is None else "1", log or "",
                LOG_LINES]  # fmt: skip
        return self.scripts.call("report", [k.job(job_id), k.events], args) == 1

    def release(self, queue: str, job_id: str, token: int) -> AckOutcome:
        return self._ack(queue, Ack("release", job_id, token))

    def postpone(
        self, queue: str, job_id: str, token: int, delay_ms: int, *, queue_wide: bool = False
    ) -> AckOutcome:
        return self._ack(queue, Ack("postpone", job_id, token, retry_in=delay_ms,
                                    queue_wide=queue_wide))  # fmt: skip

    def _ack(self, queue: str, ack: Ack) -> AckOutcome:
        return self._parse_ack(ack.kind, self.scripts.call(*self._ack_call(queue, ack)))

    # -- management -------------------------------------------------------------------------

    def cancel(self, queue: str, job_id: str, *, mode: str = "") -> CancelOutcome:
        k = self.keys(queue)
        raw = self.scripts.call(
            "cancel",
            [k.job(job_id), k.queued, k.scheduled, k.events, k.stats, k.done(job_id),
             k.succ(job_id), k.blocked, k.dedup_prefix, k.job_prefix, k.dead, k.config,
             k.finished_prefix],
            [self._now_arg(), self.events_maxlen, job_id, mode],
        )  # fmt: skip
        return CancelOutcome(_s(raw))

    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        """cancel.lua with a mode: waiting jobs are cancelled, an active one is marked, in the
        same atomic step, so no job slips between the two."""
        return self.cancel(queue, job_id, mode="force" if force else "stop")

    def cancel_requests(
        self, queue: str, leases: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], bool]:
        pipe = self.client.pipeline(transaction=False)
        for job_id, _ in leases:
            pipe.hmget(self.keys(queue).job(job_id), "state", "token", "cancel")
        out = {}
        for (job_id, token), (state, held, mark) in zip(leases, pipe.execute(), strict=True):
            if mark and _s(state) == "active" and _i(held) == token:
                out[(job_id, token)] = _s(mark) == "force"
        return out

    def cancel_active(self, queue: str, job_id: str, token: int, error: bytes) -> AckOutcome:
        return self._ack(queue, Ack("cancel", job_id, token, error))

    def change(
        self, queue: str, job_id: str, *, run_at: int | None = None, priority: int | None = None
    ) -> ChangeOutcome:
        k = self.keys(queue)
        raw = self.scripts.call(
            "change",
            [k.job(job_id), k.queued, k.scheduled, k.stats, k.wake, k.events, k.succ(job_id)],
            [self._now_arg(), self.events_maxlen, job_id, "" if run_at is None else run_at,
             "" if priority is None else priority],
        )  # fmt: skip
        return ChangeOutcome(_s(raw))

    def retry(self, queue: str, job_id: str) -> RetryOutcome:
        k = self.keys(queue)
        raw = self.scripts.call(
            "retry",
            [k.job(job_id), k.queued, k.dead, k.wake, k.events, k.finished_prefix, k.stats],
            [self._now_arg(), self.events_maxlen, job_id],
        )
        return RetryOutcome(_s(raw))

    def _prune_dead(self, queue: str) -> None:
        """Entries whose record expired leave the list by score (their expiry time)."""
        self.client.zremrangebyscore(self.keys(queue).dead, "-inf", self._now())

    def dead_letters(self, queue: str, offset: int = 0, limit: int = 100) -> list[JobRecord]:
        self._prune_dead(queue)
        ids = [_s(x) for x in self.client.zrevrange(self.keys(queue).dead, offset,
                                                      offset + limit - 1)]  # fmt: skip
        records = self.get_records(queue, ids)
        # A record cleaned by SCAN, or an id a new job took after a purge, is not dead.
        return [r for r in records.values() if r is not None and r.state is JobState.FAILED]

    def parked(self, queue: str, limit: int = 200) -> list[str]:
        ids = self.client.zrangebyscore(
            self.keys(queue).scheduled, PARKED_FLOOR, "+inf", start=0, num=limit
        )
        return [_s(x) for x in ids]

    def count_dead(self, queue: str) -> int:
        self._prune_dead(queue)
        return int(self.client.zcard(self.keys(queue).dead))

    def purge_dead(self, queue: str, job_ids: Sequence[str] | None = None) -> int:
        return len(self.purge_dead_ids(queue, job_ids))

    def purge_dead_ids(self, queue: str, job_ids: Sequence[str] | None = None) -> list[str]:
        """``purge_dead``, returning the deleted ids (journal mode deletes their entries).
        Deleted through clean.lua, which re-checks each record is still failed."""
        k = self.keys(queue)
        deleted: list[str] = []
        while True:
            if job_ids is None:
                batch = [_s(x) for x in self.client.zrange(k.dead, 0, SCAN_CHUNK - 1)]
            else:
                batch, job_ids = list(job_ids[:SCAN_CHUNK]), job_ids[SCAN_CHUNK:]
            if not batch:
                return deleted
            args = [self._now_arg(), 0, JobState.FAILED.value, *batch]
            deleted += [_s(i) for i in self.scripts.call("clean", self._clean_keys(queue), args)]
            if job_ids is None:
                # Entries that were not failed any more (retried in between) leave too, so
                # the loop always makes progress.
                self.client.zrem(k.dead, *batch)

    def _clean_keys(self, queue: str) -> list[str]:
        k = self.keys(queue)
        return [k.job_prefix, k.dead, k.finished_prefix]

    def delete_finished(self, queue: str, job_ids: Sequence[str]) -> int:
        return len(self.delete_finished_ids(queue, job_ids))

    def delete_finished_ids(self, queue: str, job_ids: Sequence[str]) -> list[str]:
        """``delete_finished``, returning the deleted ids (journal mode deletes their entries).
        clean.lua with no age limit: it re-checks each record's state before deleting."""
        ids = list(dict.fromkeys(job_ids))
        states = ",".join(s.value for s in TERMINAL_STATES)
        deleted: list[str] = []
        for start in range(0, len(ids), SCAN_CHUNK):
            args = [self._now_arg(), 0, states, *ids[start : start + SCAN_CHUNK]]
            deleted += [_s(i) for i in self.scripts.call("clean", self._clean_keys(queue), args)]
        return deleted

    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        return self.get_records(queue, [job_id])[job_id]

    def get_records(self, queue: str, job_ids: Sequence[str]) -> dict[str, JobRecord | None]:
        """Several records in one round trip per ``RECORDS_CHUNK`` ids (the mirror reads each
        batch's jobs this way): one script call whose nested reply the client parses in C,
        not a pipeline of two commands per job."""
        prefix = self.keys(queue).job_prefix
        now = int(time.time() * 1000)
        records: dict[str, JobRecord | None] = {}
        ids = list(job_ids)
        for start in range(0, len(ids), RECORDS_CHUNK):
            part = ids[start : start + RECORDS_CHUNK]
            replies = self.scripts.call("records", [prefix], [*RECORD_ARGS, *part])
            for job_id, (values, pttl) in zip(part, replies, strict=True):
                records[job_id] = _record_values(queue, job_id, values, pttl, now)
        return records

    def oldest_waiting_ms(self, queue: str, sample: int = 100) -> int | None:
        """Epoch ms since which the longest-waiting queued job has been runnable (its
        ``run_at``, else its creation), or None when nothing is queued. Read from the head of
        the line (``sample`` ids in claim order): within a priority the line is FIFO, so
        the head holds the oldest job of each priority it reaches."""
        k = self.keys(queue)
        ids = self.client.zrange(k.queued, 0, sample - 1)
        if not ids:
            return None
        pipe = self.client.pipeline(transaction=False)
        for raw in ids:
            pipe.hmget(k.job(_s(raw)), "created", "run_at")
        times = [max(_i(c), _i(r)) for c, r in pipe.execute() if c is not None]
        return min(times) if times else None

    def head_ids(self, queue: str, n: int) -> list[str]:
        """The first ``n`` ids of the queued line and of the active set (the mirror check's
        sample of jobs that are moving)."""
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(k.queued, 0, n - 1)
        pipe.zrange(k.active, 0, n - 1)
        return [_s(raw) for ids in pipe.execute() for raw in ids]

    def created_times(self, queue: str, job_ids: Sequence[str]) -> list[int]:
        """Creation time (epoch ms) of each id, 0 where the record is gone: one pipelined
        HGET per id, so the mirror can write a resync in creation order."""
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(k.job(job_id), "created")
        return [_i(raw) for raw in pipe.execute()]

    def job_states(self, queue: str, job_ids: Sequence[str]) -> list[JobState | None]:
        """One pipelined HGET per id: the state field only, never the payload."""
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(k.job(job_id), "state")
        return [None if raw is None else JobState(_s(raw)) for raw in pipe.execute()]

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        return self._outcome_by(queue, job_id, time.monotonic() + timeout)

    def _outcome_by(self, queue: str, job_id: str, deadline: float) -> FinalOutcome | None:
        """BLPOP the job's reply list until ``deadline`` (monotonic); then give up the wait."""
        done_key = self.keys(queue).done(job_id)
        while (remaining := deadline - time.monotonic()) > 0:
            wait = min(remaining, MAX_BLOCK_SECONDS)
            popped = blocking_command(self.client, wait, "BLPOP", done_key, wait)
            if popped:
                return roundtrip.outcome(popped[1])
        return self._unwait(queue, job_id)

    def _unwait(self, queue: str, job_id: str) -> FinalOutcome | None:
        """A wait that timed out withdraws its registration in one step (``unwait.lua``), so
        the job's finish pushes no reply that nobody will read; if the job finished in the
        meantime, the reply pushed for this waiter is taken instead."""
        k = self.keys(queue)
        message = self.scripts.call("unwait", [k.job(job_id), k.done(job_id)], [])
        if message:
            return roundtrip.outcome(message)
        # The record has the final word (a reply list that expired before it was read).
        return final_outcome(self.get_record(queue, job_id))

    def enqueue_and_wait(
        self, queue: str, job: NewJob, timeout: float
    ) -> tuple[StoredEnqueue, FinalOutcome | None]:
        answer = roundtrip.enqueue_and_wait(self, queue, job, timeout)
        if answer is None:  # not one plain job, a cluster, or the scripts were flushed
            return super().enqueue_and_wait(queue, job, timeout)
        return answer

    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        k = self.keys(queue)
        keys = [k.done_prefix, k.active, k.stats, k.capped, *self._settle_keys(queue), k.dead]
        keys += [k.config, k.onfail, k.onfail_prefix, k.finished_prefix]
        raw = self.scripts.call("reap", keys, [self._now_arg(), self.events_maxlen, limit])
        promoted, n_requeued = raw[0], raw[1]
        ids = [_s(x) for x in raw[2:]]
        report = ReapReport(ids[:n_requeued], ids[n_requeued:], promoted)
        report.removed = self.retain(queue, limit)
        return report

    def retain(self, queue: str, limit: int = 1000) -> int:
        """The reaper's share of retention (retain.lua): one call that looks at most at
        ``limit`` entries of each state's index. Returns the records it removed."""
        k = self.keys(queue)
        keys = [k.config, k.finished_prefix, k.job_prefix, k.dead, k.events]
        removed, _ = self.scripts.call("retain", keys, [self._now_arg(), self.events_maxlen, limit])
        return int(removed)

    def counts(self, queue: str) -> dict[JobState, int]:
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.queued)
        pipe.zcard(k.active)
        pipe.zcard(k.scheduled)
        pipe.scard(k.blocked)
        pipe.hmget(k.stats, "retrying", "completed", "failed", "cancelled")
        return _counts(pipe.execute())

    def queue_summaries(self, queues: Sequence[str]) -> dict[str, QueueSummary]:
        out: dict[str, QueueSummary] = {}
        for start in range(0, len(queues), SUMMARY_CHUNK):
            out.update(self._summaries(queues[start : start + SUMMARY_CHUNK]))
        return out

    def _summaries(self, queues: Sequence[str]) -> dict[str, QueueSummary]:
        """The reads of ``counts``, ``count_dead`` (its pruning included), the failure calls,
        the pause flag and the queue's head in one pipeline, then the heads' records in a
        second: two round trips for the chunk, however many queues."""
        now = self._now()
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            k = self.keys(queue)
            pipe.zcard(k.queued)
            pipe.zcard(k.active)
            pipe.zcard(k.scheduled)
            pipe.scard(k.blocked)
            pipe.hmget(k.stats, "retrying", "completed", "failed", "cancelled")
            pipe.zremrangebyscore(k.dead, "-inf", now)
            pipe.zcard(k.dead)
            pipe.zcard(k.onfail)
            pipe.hexists(k.config, "paused")
            pipe.zrange(k.queued, 0, 0)
        replies = pipe.execute()
        rows = [replies[i : i + 10] for i in range(0, len(replies), 10)]
        heads = self.client.pipeline(transaction=False)
        headed = []
        for queue, row in zip(queues, rows, strict=True):
            if row[9]:
                heads.hmget(self.keys(queue).job(_s(row[9][0])), "created", "run_at")
                headed.append(queue)
        oldest: dict[str, int | None] = {}
        for queue, (created, run_at) in zip(headed, heads.execute() if headed else [],
                                            strict=True):  # fmt: skip
            # None: claimed or expired between the two reads
            oldest[queue] = None if created is None else max(_i(created), _opt_i(run_at) or 0)
        return {
            queue: QueueSummary(
                _counts(row[:5]), oldest.get(queue), int(row[6]), int(row[7]), bool(row[8])
            )  # fmt: skip
            for queue, row in zip(queues, rows, strict=True)
        }

    def oldest_queued(self, queue: str) -> int | None:
        """The head of the queued ZSET (the next claim's first job): two O(log n) reads."""
        k = self.keys(queue)
        head = self.client.zrange(k.queued, 0, 0)
        if not head:
            return None
        created, run_at = self.client.hmget(k.job(_s(head[0])), "created", "run_at")
        if created is None:  # claimed or expired between the two reads
            return None
        return max(_i(created), _opt_i(run_at) or 0)

    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        return self.read_events_many({queue: after}, count, block)[queue]

    def read_events_many(
        self, after: dict[str, str], count: int = 1000, block: float | None = None
    ) -> dict[str, list[Event]]:
        """Each stream's entries after its position, read with the check that the position is
        still kept (``events.lua``: ``EventsLost`` instead of a silent gap). Blocking, one
        ``XREAD`` over every stream waits for an entry, then the checked read runs again.
        A position ``$`` (internal callers: what comes from now on) is the stream's newest id
        as this call starts."""
        after = {q: self.stream_position(q)[0] if a == "$" else a for q, a in after.items()}
        found = self._kept_events(after, count)
        if any(found.values()) or not block:
            return found
        self._wait_events(after, min(block, MAX_BLOCK_SECONDS))
        return self._kept_events(after, count)

    def _kept_events(self, after: dict[str, str], count: int) -> dict[str, list[Event]]:
        queues = list(after)
        keys = [self.keys(q).events for q in queues]
        reply = self.scripts.call("events", keys, [count, *after.values()])
        return self._checked(after, queues, reply)

    @staticmethod
    def _checked(
        after: dict[str, str], queues: list[str], reply: list[Any]
    ) -> dict[str, list[Event]]:
        """The ``events`` script's reply as events per queue; a lost position raises."""
        out: dict[str, list[Event]] = {}
        for queue, (lost, entries) in zip(queues, reply, strict=True):
            if lost:
                raise EventsLost(queue, after[queue])
            out[queue] = [_flat_event(queue, eid, fields) for eid, fields in entries]
        return out

    def _wait_events(self, after: dict[str, str], wait: float) -> None:
        """Block until some stream has an entry after its position (or ``wait`` passes)."""
        streams = ["STREAMS", *(self.keys(q).events for q in after), *after.values()]
        blocking_command(
            self.client, wait, "XREAD", "COUNT", 1, "BLOCK", int(wait * 1000), *streams
        )

    # -- failure handler calls --------------------------------------------------------------

    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        k = self.keys(queue)
        if enabled:
            self.client.hset(k.config, "onfail", "1")
        else:
            self.client.hdel(k.config, "onfail")

    def failure_hook(self, queue: str) -> bool:
        return self.client.hget(self.keys(queue).config, "onfail") in (b"1", "1")

    def claim_failure_calls(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> list[FailureCall]:
        k = self.keys(queue)
        raw = self.scripts.call(
            "onfail_claim",
            [k.onfail, k.onfail_prefix],
            [self._now_arg(), count, lease_ms, worker_id],
        )
        return [_failure_call(queue, raw[i : i + 11]) for i in range(0, len(raw), 11)]

    def settle_failure_call(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:
        k = self.keys(queue)
        args = [self._now_arg(), call.call_id, call.tries, 1 if ok else 0, retry_in_ms,
                error or b""]  # fmt: skip
        keys = [k.onfail, k.onfail_call(call.call_id)]
        return self.scripts.call("onfail_settle", keys, args) == 1

    def count_failure_calls(self, queue: str) -> int:
        return int(self.client.zcard(self.keys(queue).onfail))

    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        """Two round trips (index, then the calls' hashes); a call settled in between is
        left out."""
        k = self.keys(queue)
        members = self.client.zrange(k.onfail, offset, offset + limit - 1, withscores=True)
        pipe = self.client.pipeline(transaction=False)
        for member, _ in members:
            pipe.hmget(k.onfail_call(_s(member)), *_CALL_FIELDS)
        out = []
        for (member, due), f in zip(members, pipe.execute(), strict=True):
            if f[0] is not None:
                out.append(_failure_call(queue, [member, *f[:6], int(due), *f[6:]]))
        return out

    # -- queue control ----------------------------------------------------------------------

    def pause(self, queue: str) -> None:
        self.client.hset(self.keys(queue).config, "paused", "1")

    def resume(self, queue: str) -> None:
        k = self.keys(queue)
        self.scripts.call("control", [k.config, k.wake, k.active], ["resume"])

    def is_paused(self, queue: str) -> bool:
        return bool(self.client.hexists(self.keys(queue).config, "paused"))

    def set_limits(self, queue: str, limits: QueueLimits) -> None:
        k = self.keys(queue)
        args: list[Any] = ["limits"]
        for name in _LIMIT_FIELDS:
            value = getattr(limits, name)
            if value is not None:
                args += [name, value]
        self.scripts.call("control", [k.config, k.wake, k.active], args)

    def get_limits(self, queue: str) -> QueueLimits:
        values = self.client.hmget(self.keys(queue).config, *_LIMIT_FIELDS)
        return QueueLimits(**{n: _opt_i(v) for n, v in zip(_LIMIT_FIELDS, values, strict=True)})

    def set_retention(self, queue: str, retention: Retention | None) -> None:
        fields = {f"keep:{state}": "" for state in _RETAIN_STATES}
        for state, keep in (retention or Retention()).items():
            if keep is not None:
                fields[f"keep:{state}"] = f"{keep.count or 0}:{keep.age or 0}"
        self.client.hset(self.keys(queue).config, mapping=fields)  # one atomic HSET

    def get_retention(self, queue: str) -> Retention:
        fields = [f"keep:{state}" for state in _RETAIN_STATES]
        values = self.client.hmget(self.keys(queue).config, *fields)
        policy: dict[str, Keep] = {}
        for state, raw in zip(_RETAIN_STATES, values, strict=True):
            if raw:
                count, age = (int(x) for x in _s(raw).split(":"))
                policy[state] = Keep(count or None, age or None)
        return Retention(**policy)

    def drain(self, queue: str, *, delayed: bool = True) -> int:
        """Batches of DRAIN_CHUNK cancellations, one script call each: every cancellation is
        atomic as ``cancel``'s is, and Redis is never blocked by one huge call."""
        k = self.keys(queue)
        keys = [k.done_prefix, k.stats, *self._settle_keys(queue), k.dead, k.config,
                k.finished_prefix]  # fmt: skip
        total = 0
        while True:
            args = [self._now_arg(), self.events_maxlen, 1 if delayed else 0, DRAIN_CHUNK]
            cancelled, more = self.scripts.call("drain", keys, args)
            total += cancelled
            if not more:
                return total

    def clean(
        self,
        queue: str,
        older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> int:
        return len(self.clean_ids(queue, older_than_ms, states, limit))

    def clean_ids(
        self,
        queue: str,
        older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> list[str]:
        """``clean``, returning the deleted ids (journal mode deletes their entries).

        Finished records are indexed nowhere (they expire by their own TTL, which keeps
        completions cheap), so candidates come from a SCAN of the queue's job keys; each
        batch is checked and deleted by one script call."""
        wanted = ",".join(JobState(s).value for s in states if JobState(s) in TERMINAL_STATES)
        if not wanted or limit <= 0:
            return []
        deleted: list[str] = []
        batch: list[str] = []

        def flush() -> None:
            args = [self._now_arg(), older_than_ms, wanted, *batch[: limit - len(deleted)]]
            batch.clear()
            deleted.extend(_s(i) for i in self.scripts.call("clean", self._clean_keys(queue), args))

        for job_id in self.scan_job_ids(queue, count=SCAN_CHUNK):
            batch.append(job_id)
            if len(batch) >= SCAN_CHUNK:
                flush()
                if len(deleted) >= limit:
                    return deleted
        if batch:
            flush()
        return deleted

    def obliterate(self, queue: str, *, force: bool = False) -> int:
        """One script call refuses (active jobs, unless ``force``) or pauses the queue, so no
        claim starts while its keys are deleted; then every key under the queue's hash tag
        goes (SCAN + UNLINK), the flow-control hash last, which also lifts the pause. A job
        enqueued while this runs may be deleted or survive. Should the caller die half way,
        the queue stays paused with part of its keys: calling again finishes the job. The
        queue's obliteration generation stays odd until ``obliterated`` (Queue.obliterate,
        once the journal entries are gone too): reconcile leaves the queue alone meanwhile."""
        k = self.keys(queue)
        args = ["obliterate", 1 if force else 0]
        if self.scripts.call("control", [k.config, k.wake, k.active, k.generation], args) == -1:
            raise QueueBusy(queue)
        last_event, _added = self.stream_position(queue)
        job_prefix = k.job_prefix.encode()
        kept = (k.config.encode(), k.generation.encode())
        removed = 0
        keys: list[bytes] = []

        def flush() -> int:
            jobs = [key for key in keys if key.startswith(job_prefix)]
            others = [key for key in keys if not key.startswith(job_prefix) and key not in kept]
            keys.clear()
            if others:
                self.client.unlink(*others)
            return int(self.client.unlink(*jobs)) if jobs else 0

        for key in self.client.scan_iter(match=k.everything, count=SCAN_CHUNK):
            keys.append(key if isinstance(key, bytes) else key.encode())
            if len(keys) >= SCAN_CHUNK:
                removed += flush()
        removed += flush()
        pipe = self.client.pipeline(transaction=False)
        if last_event != "0-0":
            # An empty stream that remembers it had entries: a feed reader positioned in the
            # old one is told its events are gone (``events.lua``) instead of reading the new
            # queue's as if nothing had happened between.
            ms, seq = _stream_id(last_event)
            pipe.xadd(k.events, {"obliterated": "1"}, id=f"{ms}-{seq + 1}", maxlen=0,
                      approximate=False)  # fmt: skip
        pipe.delete(k.config)
        pipe.srem(self.global_keys.queues, queue)
        pipe.execute()
        return removed

    def obliterated(self, queue: str) -> None:
        """The obliterate of ``queue`` is over (its journal entries are gone too): reconcile
        may re-create its jobs again, fenced by the new generation."""
        k = self.keys(queue)
        self.scripts.call("control", [k.config, k.wake, k.active, k.generation], ["obliterated"])

    def generation(self, queue: str) -> int:
        """The queue's obliteration generation (``keys.generation``): odd while one runs."""
        return int(self.client.get(self.keys(queue).generation) or 0)

    def enqueue_fenced(
        self, queue: str, jobs: Sequence[NewJob], generation: int
    ) -> list[StoredEnqueue] | None:
        """``enqueue_many`` that stores nothing and returns None when the queue's generation
        is no longer ``generation``: reconcile re-creates what it read from the journal
        only if no obliterate started since it read it (issue 36, item 8). One call."""
        name, keys, args = self._enqueue_call(queue, jobs)
        raw = self.scripts.call(name, [*keys, self.keys(queue).generation], [*args, generation])
        if raw == [-1]:
            return None
        return self._parse_enqueue(jobs, raw)

    # -- event consumer groups (the model mirror) -------------------------------------------
    # Redis-only: a consumer group remembers what it has read and what is acknowledged, so the
    # mirror misses nothing across restarts and several mirrors share the work.

    def ensure_group(self, queue: str, group: str) -> bool:
        """Create ``group`` on the queue's stream, reading from its first event on. True when
        it had to be created (first start, or the stream was lost: flush, restart, obliterate)."""
        try:
            self.client.xgroup_create(self.keys(queue).events, group, id="0", mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    def server_id(self) -> str:
        """The Redis server's ``run_id``: it changes when the server restarts, which may have
        lost or rolled back any key (the mirror resyncs when it sees a new one)."""
        return _s(self.client.info("server")["run_id"])

    def read_group(
        self,
        queues: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int = 1000,
        block: float | None = None,
        pending: bool = False,
        lost: list[str] | None = None,
    ) -> list[Event]:
        """New events for this consumer (or, with ``pending``, those it read but never acked).

        A pending entry the stream cap trimmed comes back without fields: it can never be
        read again, so its id is appended to ``lost`` (when given) for the caller to ack and
        to heal the gap it leaves."""
        streams = {self.keys(q).events: ("0" if pending else ">") for q in queues}
        by_key = {self.keys(q).events: q for q in queues}
        if not block and not hasattr(self.client, "connection_pool"):  # a RedisCluster
            reply = self.client.xreadgroup(group, consumer, streams, count=count)
        else:
            wait = min(block, MAX_BLOCK_SECONDS) if block else 0.0
            waiting = ("BLOCK", int(wait * 1000)) if block else ()
            # The reply as parsed (entries' fields as flat lists): _flat_event reads them.
            reply = blocking_command(
                self.client, wait, "XREADGROUP", "GROUP", group, consumer, "COUNT", count,
                *waiting, "STREAMS", *streams, *streams.values(), raw_reply=True,
            )  # fmt: skip
        events = []
        for stream, entries in reply.items() if isinstance(reply, dict) else reply or []:
            queue = by_key[_s(stream)]
            for event_id, fields in entries:
                if fields:
                    events.append(_flat_event(queue, event_id, fields))
                elif lost is not None:  # a pending entry trimmed before it was acked
                    lost.append(_s(event_id))
        return events

    def ack_events(self, queue: str, group: str, event_ids: Sequence[str]) -> None:
        if event_ids:
            self.client.xack(self.keys(queue).events, group, *event_ids)

    def claim_stale_events(
        self, queue: str, group: str, consumer: str, min_idle_ms: int, count: int = 1000
    ) -> list[Event]:
        """Take over events another consumer read but did not ack for ``min_idle_ms`` (it died)."""
        reply = self.client.xautoclaim(
            self.keys(queue).events, group, consumer, min_idle_ms, "0-0", count=count
        )
        return [_event(queue, eid, f) for eid, f in reply[1] if f]

    def events_lost(self, queue: str, group: str) -> bool:
        """True when the stream cap trimmed events this group never read: the mirror must
        re-read the queue's records instead of trusting the stream."""
        key = self.keys(queue).events
        info = self.client.xinfo_stream(key)
        groups = {_s(g["name"]): g for g in self.client.xinfo_groups(key)}
        if group not in groups:
            return False
        trimmed = info["entries-added"] - info["length"]
        if trimmed <= 0:
            return False
        g = groups[group]
        entries_read = g["entries-read"]
        if entries_read is not None:
            if trimmed > entries_read:
                return True
            # Trimmed while the group read just behind the trim: XREADGROUP skips what is
            # gone and counts only what it delivers, so the group's place passes the gap and
            # the test above can no longer see it. Redis's lag then counts the skipped
            # entries: more than the stream holds, or anything at all once the group has
            # read the newest entry, is a gap (a 250,000-job run skipped 1,165 events so, and the
            # mirror waited for them for good).
            lag = g.get("lag")
            if lag:
                caught_up = _s(g["last-delivered-id"]) == _s(info["last-generated-id"])
                return caught_up or lag > info["length"]
            return False
        # Redis could not count for us: lost if the oldest surviving entry is past our place.
        first = _s(info.get("recorded-first-entry-id") or "0-0")
        return _stream_id(first) > _stream_id(_s(groups[group]["last-delivered-id"]))

    def group_backlog(self, queue: str, group: str) -> tuple[int, int | None]:
        """(events the group has not acknowledged, epoch ms of the oldest of them or None).

        Both halves count: entries delivered but not acked (a batch being written, or a dead
        consumer's) and entries not delivered yet. Entry ids carry the server time they were
        added at, so the age needs no read of the entries' fields. Without the group (the
        stream was lost, or the mirror never ran) everything in the stream is behind."""
        key = self.keys(queue).events
        try:
            info = self.client.xinfo_stream(key)
        except Exception as exc:
            if "no such key" in str(exc).lower():
                return 0, None
            raise
        groups = {_s(g["name"]): g for g in self.client.xinfo_groups(key)}
        first = info.get("first-entry")
        if group not in groups:
            return int(info["length"]), _stream_id(_s(first[0]))[0] if first else None
        g = groups[group]
        oldest: list[int] = []
        pending = 0
        if g["pending"]:  # read again: a batch may have been acked since XINFO
            summary = self.client.xpending(key, group)
            pending = int(summary["pending"])
            if pending:
                oldest.append(_stream_id(_s(summary["min"]))[0])
        after = "(" + _s(g["last-delivered-id"])
        nxt = self.client.xrange(key, min=after, max="+", count=1)
        undelivered = 0  # nothing after the group's place: Redis's lag may count a gap
        if nxt:
            oldest.append(_stream_id(_s(nxt[0][0]))[0])
            undelivered = g.get("lag")
            if undelivered is None:  # Redis cannot count past a trim: count what is there
                undelivered = len(self.client.xrange(key, min=after, max="+"))
            # Never more than the stream holds (a lag that counts entries trimmed unread is
            # a gap, which events_lost reports and the mirror heals).
            undelivered = min(int(undelivered), int(info["length"]))
        return pending + int(undelivered), min(oldest) if oldest else None

    def stream_position(self, queue: str) -> tuple[str, int]:
        """(newest entry id, entries ever added) of the queue's stream, read in one reply."""
        try:
            info = self.client.xinfo_stream(self.keys(queue).events)
        except Exception as exc:
            if "no such key" in str(exc).lower():
                return "0-0", 0
            raise
        return _s(info["last-generated-id"]), int(info["entries-added"])

    def set_group_position(self, queue: str, group: str, position: tuple[str, int]) -> None:
        """Move ``group`` to ``position`` (from ``stream_position``) and acknowledge every
        entry before it.

        For the mirror right after it re-read every live record of the queue: the entries up
        to a position taken *before* that re-read are reflected in the rows already. The
        group's read counter is set to the stream's, so ``events_lost`` measures later trims
        from here instead of reporting the healed gap forever."""
        last_id, added = position
        key = self.keys(queue).events
        self.client.execute_command("XGROUP", "SETID", key, group, last_id, "ENTRIESREAD", added)
        while True:  # entries delivered before the skip and never acked: covered too
            stale = self.client.xpending_range(key, group, min="-", max=last_id, count=1000)
            if not stale:
                return
            self.client.xack(key, group, *[p["message_id"] for p in stale])

    def removed_since(self, queue: str, since_ms: int, job_ids: Sequence[str]) -> dict[str, int]:
        """Of ``job_ids``, those the stream says the retention removed at or after
        ``since_ms``: id -> when (ms). The journal's reconcile reads it without the mirror,
        which otherwise tells it (a removed record is no lost job). A ``removed`` event the
        stream no longer keeps is not found: that job is then treated as lost."""
        key = self.keys(queue).events
        wanted, found = set(job_ids), {}
        start = f"{since_ms}-0"
        while wanted:
            entries = self.client.xrange(key, min=start, max="+", count=1000)
            for eid, fields in entries:
                event = _event(queue, eid, fields)
                if event.kind == "removed" and event.job_id in wanted:
                    found[event.job_id] = event.at
            if len(entries) < 1000:
                break
            start = "(" + _s(entries[-1][0])
        return found

    def record_mirror_gap(self, queue: str, gap: dict[str, Any]) -> None:
        """Keep the mirror's latest gap of ``queue`` (when, why, rows re-read) where health
        and the admin read it, whichever process the mirror runs in."""
        self.client.hset(self.global_keys.mirror_gaps, queue, json.dumps(gap))

    def mirror_gaps(self) -> dict[str, dict[str, Any]]:
        """The latest gap the mirror resynced, per queue (``record_mirror_gap``)."""
        raw = self.client.hgetall(self.global_keys.mirror_gaps)
        gaps = {}
        for queue, value in raw.items():
            try:
                gaps[_s(queue)] = json.loads(value)
            except ValueError:  # written by hand: not ours to interpret
                continue
        return gaps

    def set_mirror_sampled(self, queue: str, mode: dict[str, Any] | None) -> None:
        """Say (``mode``: since, why, counts) or unsay (None) that the mirror shows ``queue``
        as counts and a sample of records rather than every job, where health, the admin
        and every mirror process read it."""
        if mode is None:
            self.client.hdel(self.global_keys.mirror_sampled, queue)
        else:
            self.client.hset(self.global_keys.mirror_sampled, queue, json.dumps(mode))

    def mirror_sampled(self) -> dict[str, dict[str, Any]]:
        """The queues the mirror shows as counts and a sample (``set_mirror_sampled``)."""
        out = {}
        for queue, value in self.client.hgetall(self.global_keys.mirror_sampled).items():
            try:
                out[_s(queue)] = json.loads(value)
            except ValueError:  # written by hand: not ours to interpret
                continue
        return out

    def sample_ids(self, queue: str, n: int) -> list[str]:
        """A bounded sample of the jobs most worth showing, newest per state: the newest
        ``n`` queued jobs and the next ``n`` to run, the active ones, the newest scheduled
        and dead-lettered, and the jobs named by the newest ``3·n`` stream entries (the
        jobs that just finished: finished records are in no set). At most about ``8·n``."""
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(k.queued, 0, n - 1)
        pipe.zrevrange(k.queued, 0, n - 1)
        pipe.zrange(k.active, 0, n - 1)
        pipe.zrevrange(k.scheduled, 0, n - 1)
        pipe.zrevrange(k.dead, 0, n - 1)
        pipe.xrevrange(k.events, "+", "-", count=3 * n)
        *sets, entries = pipe.execute()
        ids = [_s(raw) for members in sets for raw in members]
        ids += [_s(job) for _, f in entries if f and (job := f.get(b"job") or f.get("job"))]
        return list(dict.fromkeys(ids))

    def record_states(self, queue: str, job_ids: Sequence[str]) -> list[tuple | None]:
        """(state, attempts, finished ms, created ms) per id, None where the record is gone:
        what tells the mirror which rows an exact resync must rewrite, and in which order,
        for a few bytes a job."""
        prefix = self.keys(queue).job_prefix
        out: list[tuple | None] = []
        ids = list(job_ids)
        for start in range(0, len(ids), RECORDS_CHUNK * 4):
            part = ids[start : start + RECORDS_CHUNK * 4]
            args = [4, "state", "attempts", "finished", "created", *part]
            for (state, attempts, finished, created), _ in self.scripts.call(
                "records", [prefix], args
            ):
                out.append(
                    None if state is None
                    else (_s(state), _i(attempts), _opt_i(finished), _i(created))
                )  # fmt: skip
        return out

    def scan_job_ids(self, queue: str, count: int = 1000) -> Iterator[str]:
        """Every job id with a live record in ``queue`` (SCAN: slow, for resyncs only)."""
        prefix = self.keys(queue).job_prefix
        for key in self.client.scan_iter(match=_glob_escape(prefix) + "*", count=count):
            yield _s(key)[len(prefix) :]

    def register_queue(self, queue: str) -> None:
        self.client.sadd(self.global_keys.queues, queue)

    def list_queues(self) -> list[str]:
        return sorted(_s(q) for q in self.client.smembers(self.global_keys.queues))

    # -- worker registry --------------------------------------------------------------------

    def register_worker(self, worker_id: str, info: dict, ttl_ms: int) -> None:
        now = self._now()
        g = self.global_keys
        pipe = self.client.pipeline(transaction=False)
        pipe.set(g.worker(worker_id), json.dumps({**info, "last_seen": now}), px=ttl_ms)
        pipe.zadd(g.workers, {worker_id: now + ttl_ms})
        pipe.zremrangebyscore(g.workers, "-inf", now)
        pipe.execute()

    def deregister_worker(self, worker_id: str) -> None:
        g = self.global_keys
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(g.worker(worker_id))
        pipe.zrem(g.workers, worker_id)
        pipe.execute()

    def send_worker_command(self, worker_id: str, command: dict) -> None:
        self.client.hset(self.global_keys.worker_commands, worker_id, json.dumps(command))

    def take_worker_command(self, worker_id: str) -> dict | None:
        pipe = self.client.pipeline(transaction=True)  # one key: atomic on a cluster too
        pipe.hget(self.global_keys.worker_commands, worker_id)
        pipe.hdel(self.global_keys.worker_commands, worker_id)
        raw, _ = pipe.execute()
        try:
            command = json.loads(raw) if raw else None
        except ValueError:  # written by hand: not a command
            return None
        return command if isinstance(command, dict) else None

    def list_workers(self) -> list[WorkerRecord]:
        g = self.global_keys
        ids = [_s(x) for x in self.client.zrangebyscore(g.workers, self._now(), "+inf")]
        if not ids:
            return []
        out = []
        for worker_id, raw in zip(ids, self.client.mget([g.worker(i) for i in ids]), strict=True):
            if raw:
                info = json.loads(raw)
                out.append(WorkerRecord(worker_id, info, int(info.pop("last_seen", 0))))
        return out

    def broadcasts(self) -> Any:
        from .broadcast import RedisBroadcasts

        if getattr(self, "_broadcasts", None) is None:
            self._broadcasts = RedisBroadcasts(self.client, prefix=self.prefix, clock=self.clock)
        return self._broadcasts

    # -- async twins: native async I/O on a plain ``redis.Redis`` client (``aio.py``) -------
    # (``aio.py`` reads records through ``_record_of``: one decoding for both paths.)
    _record_of = staticmethod(_record)

    async def aregister_queue(self, queue: str) -> None:
        if not aio.native(self):
            return await super().aregister_queue(queue)
        return await aio.register_queue(self, queue)

    async def aenqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        if not aio.native(self):
            return await super().aenqueue(queue, job)
        return await aio.enqueue(self, queue, job)

    async def aget_record(self, queue: str, job_id: str) -> JobRecord | None:
        if not aio.native(self):
            return await super().aget_record(queue, job_id)
        return await aio.get_record(self, queue, job_id)

    async def await_for_outcome(
        self, queue: str, job_id: str, timeout: float
    ) -> FinalOutcome | None:
        if not aio.native(self):
            return await super().await_for_outcome(queue, job_id, timeout)
        return await aio.wait_for_outcome(self, queue, job_id, timeout)

    def close(self) -> None:
        self.client.close()
