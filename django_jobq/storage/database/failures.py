"""Failure handler calls: a job that failed for good on a queue whose failure hook is on leaves a
call row (written in the failing transaction), which failure threads claim, run and settle."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from ...job import FailureCall
from .core import _dt, _json_bytes, _ms, _storable_json
from .events import Events


class FailureCalls(Events):
    """The rows of failure handler calls and their leases."""

    def _record_failure_call(self, queue: str, job_id: str, pk: int, now: int) -> None:
        """In the transaction that failed row ``pk`` for good: one statement copies what the
        failure handler needs into a call row, only when the queue's hook is on."""
        at = self._param_dt(now)
        self._sql(
            f"INSERT INTO {self._quoted(self.FailureCallRow)} (queue, job_id, payload,"
            " content_type, error, attempts, failed_at, due_at, tries, worker)"
            " SELECT j.queue, %s, j.payload, j.content_type, j.error, j.attempts, %s, %s, 0, ''"
            f" FROM {self._table} j JOIN {self._quoted(self.QueueConfig)} c"
            " ON c.name = j.queue AND c.failure_hook = %s WHERE j.id = %s",
            [job_id, at, at, True, pk],
            fetch=False,
        )

    def _calls(self):
        self._drop_broken_connection()  # the worker's failure thread holds its connection long
        return self.FailureCallRow.objects.using(self.using)

    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        with self._atomic():
            self._write_lock()
            self._configs().get_or_create(name=queue)
            self._configs().filter(name=queue).update(failure_hook=enabled)

    def failure_hook(self, queue: str) -> bool:
        return self._configs().filter(name=queue, failure_hook=True).exists()

    @staticmethod
    def _failure_call(row: Any) -> FailureCall:
        return FailureCall(
            row.queue, str(row.pk), row.job_id, bytes(row.payload), row.content_type,
            _json_bytes(row.error) or b"", row.attempts, _ms(row.failed_at), _ms(row.due_at),
            row.tries, _json_bytes(row.last_error), row.worker or None,
        )  # fmt: skip

    def claim_failure_calls(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> list[FailureCall]:
        with self._atomic():
            self._write_lock()
            now = self._now()
            qs = self._calls().filter(queue=queue, due_at__lte=_dt(now)).order_by("due_at", "id")
            if self.vendor == "postgresql":
                qs = qs.select_for_update(skip_locked=True)
            pks = list(qs.values_list("id", flat=True)[:count])
            if not pks:
                return []
            self._calls().filter(pk__in=pks).update(
                due_at=_dt(now + lease_ms), tries=F("tries") + 1, worker=worker_id
            )
            rows = self._calls().filter(pk__in=pks).order_by("due_at", "id")
            return [self._failure_call(row) for row in rows]

    def settle_failure_call(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:
        held = self._calls().filter(pk=int(call.call_id), queue=queue, tries=call.tries)
        with self._atomic():
            self._write_lock()
            if ok:
                return held.delete()[0] > 0
            due = _dt(self._now() + max(retry_in_ms, 0))
            last_error = _storable_json(error, self.vendor) if error else None
            return held.update(due_at=due, last_error=last_error) > 0

    def count_failure_calls(self, queue: str) -> int:
        return self._calls().filter(queue=queue).count()

    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        rows = self._calls().filter(queue=queue).order_by("due_at", "id")[offset : offset + limit]
        return [self._failure_call(row) for row in rows]
