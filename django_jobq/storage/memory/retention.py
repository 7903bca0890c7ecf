"""Retention of finished jobs: only the policy is kept here. As on Redis it is applied in the step
that finishes a job (``MemoryCore._keep``) and in the reaper's (``reap``), so no pass is added."""

from __future__ import annotations

from ...job import Retention
from .operations import Operations


class Retaining(Operations):
    def set_retention(self, queue: str, retention: Retention | None) -> None:
        with self._cond:
            self._q(queue).retention = retention or Retention()

    def get_retention(self, queue: str) -> Retention:
        with self._cond:
            return self._peek(queue).retention
