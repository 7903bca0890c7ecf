"""Processes the fault tests start and stop themselves, always by PID: private Redis servers
(for faults injected into Redis) and a supervisor of ``runworker`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from django_jobq.storage.redis.connection import client_from_url

from ..helpers import ROOT, wait_until, worker_ports

# Ports of this suite's private servers and proxies (nothing else on the machine uses them).
PORT_RANGE = worker_ports(range(7100, 7200))  # this xdist worker's share
_next_port = iter(PORT_RANGE)


def free_port() -> int:
    import socket

    for port in _next_port:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port left in {PORT_RANGE}")


class PrivateRedis:
    """A redis-server of one test, on loopback, persistence off unless asked for."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / f"redis-{self.port}.log"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir), "--logfile", str(self.log), *extra],
        )  # fmt: skip
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = client_from_url(self.url)
        if not wait_until(self._answers, 30, 0.05):
            self.stop()
            raise RuntimeError(f"private redis on {self.port} did not start: {self.log}")

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    def connected_clients(self) -> int:
        return int(self.client.info("clients")["connected_clients"])

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def worker_env(prefix: str, redis_url: str, ledger_dsn: str, tmp: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
        "PYTHONPATH": str(ROOT),
        "JOBQ_TEST_PREFIX": prefix,
        "JOBQ_TEST_REDIS_URL": redis_url,
        "JOBQ_TEST_SQLITE": str(tmp / "worker.sqlite3"),
        "JOBQ_CHAOS_LEDGER_DSN": ledger_dsn,
        **extra,
    }


@dataclass
class Kill:
    slot: int
    pid: int
    at: float  # epoch seconds


class Supervisor:
    """Keeps ``slots`` processes of one command (``runworker ...``) running, as systemd or
    Kubernetes would: a process that died is started again (after ``restart_delay``).
    ``kill`` sends a signal to one slot's process and records when, for the recovery-time
    figures."""

    def __init__(
        self,
        args: list[str],
        env: dict,
        log_dir: Path,
        slots: int,
        *,
        restart_delay: float = 0.2,
        launcher: list[str] | None = None,
    ) -> None:
        self.args = args
        self.env = env
        self.log_dir = log_dir
        self.restart_delay = restart_delay
        self.launcher = launcher or [sys.executable, str(ROOT / "manage.py")]
        self.kills: list[Kill] = []
        self.exits: list[int] = []  # return codes of processes that died and were restarted
        self.starts = 0
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = [self._start(i) for i in range(slots)]
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, daemon=True)
        self._watch.start()

    def _start(self, slot: int) -> subprocess.Popen:
        self.starts += 1
        out = (self.log_dir / f"worker-{slot}-{self.starts}.log").open("w")
        proc = subprocess.Popen(
            [*self.launcher, *self.args, "--settings", "tests.chaos.settings"],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        proc.log_path = out.name  # type: ignore[attr-defined]
        return proc

    def _watch_loop(self) -> None:
        while not self._stop.wait(0.05):
            for slot, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    self.exits.append(proc.returncode)
                    time.sleep(self.restart_delay)
                    with self.lock:
                        if not self._stop.is_set():
                            self.procs[slot] = self._start(slot)

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def kill(self, slot: int, sig: int = signal.SIGKILL) -> Kill:
        with self.lock:
            proc = self.procs[slot]
            kill = Kill(slot, proc.pid, time.time())
            os.kill(proc.pid, sig)
            if sig == signal.SIGKILL:
                self.kills.append(kill)
        return kill

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob("worker-*.log")))

    def stop(self) -> None:
        self._stop.set()
        self._watch.join(5)
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                except ProcessLookupError:
                    pass
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
