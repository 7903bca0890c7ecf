"""A redis-server of one test, on loopback and a port of its own, started and stopped by PID.

For tests that must do to Redis what no shared server may suffer: lose every key (FLUSHALL,
an empty restart), stop answering, or fill up under a tiny ``maxmemory``. The fault suite has
its own (``tests/chaos/servers.py``) on another port range, so both can run at once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from django_jobq.storage.redis.connection import client_from_url

from .helpers import bindable, wait_until, worker_ports

# Ports of these private servers: nothing else on the machine uses them.
_first, _, _last = os.environ.get("JOBQ_TEST_PRIVATE_PORTS", "7300-7319").partition("-")
PORT_RANGE = worker_ports(range(int(_first), int(_last) + 1))


def free_port() -> int:
    """A port of the range nothing listens on (``bindable``, as redis-server binds)."""
    for port in filter(bindable, PORT_RANGE):
        return port
    raise RuntimeError(f"no free port left in {PORT_RANGE}")


def closed_port() -> int:
    """A port of the range that nothing listens on (an unreachable Redis)."""
    return free_port()


def keep_full(client) -> None:
    """A Redis that just refused a write at its ``maxmemory`` stays full: the refusal came
    with used memory just over the limit, counting the refused call's own arguments; once
    their buffer is freed the next large call can start under it and be let through (CI saw
    an API enqueue answered 201 that way). With the limit halved below what the stored data
    takes, every later write is refused for as long as the data is kept."""
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)


class PrivateRedis:
    """``redis-server`` on a free port of ``PORT_RANGE``, persistence off; ``stop`` by PID."""

    def __init__(self, workdir: Path, *extra: str, port: int | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        # Another test process may take a free port first: try the next one.
        for _ in range(1 if port else len(PORT_RANGE)):
            self.port = port or free_port()
            self.log = workdir / f"redis-{self.port}.log"
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir), "--logfile", str(self.log),
                 *extra],
            )  # fmt: skip
            self.url = f"redis://127.0.0.1:{self.port}/0"
            self.client = client_from_url(self.url)
            wait_until(lambda: self.proc.poll() is not None or self._answers(), 10, 0.05)
            if self._answers():
                return
            self.stop()
        raise RuntimeError(f"no private redis could start in {PORT_RANGE}: {workdir}")

    @classmethod
    def on_port(cls, workdir: Path, port: int, *extra: str) -> PrivateRedis:
        """A server on ``port`` (an empty restart of one that was stopped)."""
        return cls(workdir, *extra, port=port)

    def _answers(self) -> bool:
        """Our own process answers (not another test's server that won the port race)."""
        if self.proc.poll() is not None:
            return False
        try:
            return int(self.client.info("server")["process_id"]) == self.proc.pid
        except Exception:
            return False

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
