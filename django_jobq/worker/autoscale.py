"""Dynamic concurrency: a worker's in-flight limit follows what its jobs need.

I/O-bound jobs want many in flight; CPU-bound ones gain nothing past the cores they can use and
lose latency to contention. The controller samples, every ``interval`` seconds, how full the
worker's slots were, the CPU the worker (and its pool's children) used, and how long handlers
took, and moves the limit one step at a time between ``minimum`` and ``maximum``:

- up, when the slots were full (jobs were waiting for a slot), the CPU has room and handlers
  are not slower than the best seen (more in flight would add throughput);
- down, when the CPU is saturated or handlers became much slower than the best seen (more in
  flight only adds contention), or when most slots sat idle (there is nothing to gain);
- otherwise it stays, so the limit settles instead of oscillating.

The decision itself is a pure function (``decide``), tested on its own; the worker feeds it
measurements and applies its result.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

logger = logging.getLogger("django_jobq.worker")

CPU_HIGH = 0.90  # share of the cores the worker may use before it backs off
CPU_ROOM = 0.75  # below this share there is room for more in flight
SLOWER = 2.0  # handlers this many times slower than the best seen: contention, back off
NOT_SLOWER = 1.5  # ... and up to this, more in flight is still worth trying
FULL = 0.9  # slots in use (share of the limit) that count as full
IDLE = 0.4  # below this share of the limit in use, capacity is idle


@dataclass(frozen=True, slots=True)
class Sample:
    """What one interval looked like."""

    utilisation: float  # mean share of the limit in use (0..1+)
    cpu: float  # CPU seconds per wall second per core (0..1)
    latency_ms: float | None  # mean handler run time in the interval (None: none finished)


@dataclass(frozen=True, slots=True)
class Decision:
    limit: int
    reason: str


def decide(
    limit: int, minimum: int, maximum: int, sample: Sample, best_ms: float | None
) -> Decision:
    """The next in-flight limit for ``sample``; ``best_ms`` is the lowest latency seen so far."""
    step = max(1, limit // 4)
    slower = sample.latency_ms / best_ms if sample.latency_ms is not None and best_ms else 1.0
    if sample.cpu >= CPU_HIGH and limit > minimum:
        return Decision(max(minimum, limit - step), f"cpu {sample.cpu:.0%}")
    if slower >= SLOWER and limit > minimum:
        return Decision(max(minimum, limit - step), f"handlers {slower:.1f}x slower than best")
    if sample.utilisation >= FULL and sample.cpu < CPU_ROOM and slower <= NOT_SLOWER:
        if limit < maximum:
            return Decision(min(maximum, limit + step), "slots full, cpu has room")
        return Decision(limit, "at maximum")
    if sample.utilisation < IDLE and limit > minimum:
        return Decision(max(minimum, limit - step), f"slots {sample.utilisation:.0%} used")
    return Decision(limit, "steady")


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of this process and of ``pids`` (pool children), from /proc
    where there is one; elsewhere this process only."""
    own = os.times()
    total = own.user + own.system
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):  # gone, or no /proc here
            continue
    return total


@dataclass(slots=True)
class Autoscaler:
    minimum: int
    maximum: int
    interval: float = 5.0
    limit: int = 0
    best_ms: float | None = None
    last: dict = field(default_factory=dict)  # the latest decision, for WorkerInfo and logs
    _used_sum: float = 0.0
    _samples: int = 0
    _run_ms: float = 0.0
    _runs: int = 0
    _cpu_at: float = 0.0
    _wall_at: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"autoscale needs 1 <= MIN <= MAX, got {self.minimum},{self.maximum}")
        self.limit = self.limit or self.minimum
        self._wall_at = time.monotonic()
        self._cpu_at = cpu_seconds([])

    def observe_slots(self, in_flight: int) -> None:
        self._used_sum += in_flight / self.limit
        self._samples += 1

    def observe_run(self, ms: float) -> None:
        self._run_ms += ms
        self._runs += 1

    def step(self, child_pids: list[int]) -> Decision:
        now, cpu = time.monotonic(), cpu_seconds(child_pids)
        wall = max(now - self._wall_at, 1e-6)
        cores = os.cpu_count() or 1
        sample = Sample(
            utilisation=self._used_sum / self._samples if self._samples else 0.0,
            cpu=max(0.0, cpu - self._cpu_at) / wall / cores,
            latency_ms=self._run_ms / self._runs if self._runs else None,
        )
        decision = decide(self.limit, self.minimum, self.maximum, sample, self.best_ms)
        if sample.latency_ms is not None:
            self.best_ms = min(self.best_ms or sample.latency_ms, sample.latency_ms)
        if decision.limit != self.limit:
            logger.info("autoscale: %d -> %d in flight (%s)", self.limit, decision.limit,
                        decision.reason)  # fmt: skip
        self.last = {
            "limit": decision.limit, "min": self.minimum, "max": self.maximum,
            "reason": decision.reason, "cpu": round(sample.cpu, 3),
            "utilisation": round(sample.utilisation, 3),
            "latency_ms": None if sample.latency_ms is None else round(sample.latency_ms, 2),
        }  # fmt: skip
        self.limit = decision.limit
        self._used_sum = self._run_ms = 0.0
        self._samples = self._runs = 0
        self._cpu_at, self._wall_at = cpu, now
        return decision
