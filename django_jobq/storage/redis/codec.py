"""Reading what the Redis backend's scripts and streams answer: records, events and failure
calls from raw replies, built by position where the shape is known (the mirror and the
claim path decode thousands a second) and defensively where a stream entry could have been
written by anyone.

Shared by the sync storage (``storage.py``), its cluster variant and the async producer path
(``aio.py``), so that one decoding serves all three.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...job import Event, FailureCall, JobRecord
from ...states import JobState
from .builders import positional_builder

# A state as the scripts return it (bytes) -> JobState: a dict read instead of the enum's
# constructor (a lone enqueue parses one state per call; bulk enqueues one per job).
_STATES: dict[bytes | str, JobState] = {
    **{state.value.encode(): state for state in JobState},
    **{state.value: state for state in JobState},
}


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_s(value: bytes | str | None) -> str | None:
    return None if value is None else _s(value)


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
            worker = fields.get(b"worker")
            return Event(
                event_id.decode(), queue, fields[b"job"].decode(), fields[b"kind"].decode(),
                int(fields[b"at"]), None if worker is None else worker.decode(),
            )  # fmt: skip
        f = {_s(a): _s(b) for a, b in fields.items()}
        return Event(_s(event_id), queue, f["job"], f["kind"], int(f["at"]), f.get("worker"))
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
                int(fields[5]), fields[7].decode() if n == 8 else None,
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
