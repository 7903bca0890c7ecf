"""A standalone Spark cluster (one master, one worker) from the pip-installed PySpark, on
loopback with free ports, for the scale-out test. Both are stopped by PID; the worker's
executors die with the worker's own process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": str(workdir / "work"),
        }

    def _start(self, name: str, *args: str) -> Path:
        log = self.workdir / f"{name}.log"
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: executors included, nobody else's
        )  # fmt: skip
        self.procs.append(proc)
        return log

    def start(self, timeout: float = 120) -> None:
        master_log = self._start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(free_port()),
        )  # fmt: skip
        self._wait_for(master_log, "I have been elected leader", timeout)
        worker_log = self._start(
            "worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", "2", "--memory", "2g", self.url,
        )  # fmt: skip
        self._wait_for(worker_log, "Successfully registered with master", timeout)

    def _wait_for(self, log: Path, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        raise RuntimeError(f"{log.name}: no {text!r} in time:\n{log.read_text()[-3000:]}")

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM the worker, then the master (by PID); whatever of their process groups is
        left after the grace period gets SIGKILL."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # executors the worker did not reap
            except ProcessLookupError:
                pass

    def alive(self, timeout: float = 15) -> list[int]:
        """PIDs still running in the cluster's process groups once ``timeout`` has passed
        (a SIGKILLed process takes a moment to go; zombies no longer run and are not listed)."""
        deadline = time.monotonic() + timeout
        while (pids := self._running()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return pids

    def _running(self) -> list[int]:
        groups = {p.pid for p in self.procs}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp ...
            if fields[0] != "Z" and int(fields[2]) in groups:
                pids.append(int(entry.name))
        return pids
