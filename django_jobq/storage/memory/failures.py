"""Failure handler calls: a job failing for good on a queue whose hook is on leaves a call, in the
failing step and before a singleton successor takes the id; failure threads claim and settle it."""

from __future__ import annotations

from dataclasses import replace

from ...job import FailureCall
from .core import _Queue, _Rec, _step
from .events import Events


class FailureCalls(Events):
    def _record_failure_call(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        call_id = f"{rec.job_id}:{next(self._versions)}"
        q.failure_calls[call_id] = FailureCall(
            queue, call_id, rec.job_id, rec.payload, rec.content_type, rec.error or b"",
            rec.attempts, now, now, 0,
        )  # fmt: skip

    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        with self._cond:
            self._q(queue).failure_hook = enabled

    def failure_hook(self, queue: str) -> bool:
        with self._cond:
            return self._peek(queue).failure_hook

    def _pending_calls(self, queue: str) -> list[FailureCall]:
        calls = self._peek(queue).failure_calls.values()
        return sorted(calls, key=lambda c: (c.due_at, c.call_id))

    @_step()
    def claim_failure_calls(self, q: _Queue, now: int, /, queue: str, worker_id: str,
                            count: int, lease_ms: int) -> list[FailureCall]:  # fmt: skip
        due = [c for c in self._pending_calls(queue) if c.due_at <= now][:count]
        out = []
        for call in due:
            leased = replace(call, due_at=now + lease_ms, tries=call.tries + 1, worker=worker_id)
            q.failure_calls[call.call_id] = leased
            out.append(leased)
        return out

    def settle_failure_call(
        self, queue: str, call: FailureCall, *, ok: bool, retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:  # fmt: skip
        with self._cond:
            q = self._peek(queue)
            if (held := q.failure_calls.get(call.call_id)) is None or held.tries != call.tries:
                return False
            if ok:
                del q.failure_calls[call.call_id]
            else:
                due = self._now() + max(retry_in_ms, 0)
                q.failure_calls[call.call_id] = replace(held, due_at=due, last_error=error)
            return True

    def count_failure_calls(self, queue: str) -> int:
        with self._cond:
            return len(self._peek(queue).failure_calls)

    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        with self._cond:
            return self._pending_calls(queue)[offset : offset + limit]
