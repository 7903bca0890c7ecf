"""A local Redis Cluster of six ``redis-server`` processes (3 masters, 3 replicas) on loopback.

Started once per test session (per xdist worker: each gets a block of ports of its own), created
with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`` as an operator would,
and stopped by PID. Persistence is off: the fault tests want a killed master's data to be gone,
as it is on a failover whose replica had not caught up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from .helpers import wait_until

# Ports of the cluster nodes (their bus ports are these plus 10000). Nothing else uses them.
_first, _, _last = os.environ.get("JOBQ_TEST_CLUSTER_PORTS", "7800-7899").partition("-")
PORTS = range(int(_first), int(_last) + 1)
NODES = 6
# How long a master may be unreachable before its replica takes over. Short, for fault tests
# that wait for a failover; long enough that a loaded 2-core machine does not trigger one.
NODE_TIMEOUT_MS = 3000


class ClusterUnsupported(Exception):
    """``redis-server`` here cannot run in cluster mode."""


def worker_block(second: bool = False) -> range:
    """Ports of one cluster of this xdist worker: gw0 has the first twenty ports (a session
    cluster on the first six, a fault test's own cluster from the eleventh), gw1 the next
    twenty, and so on; the last twenty are ``bench.cluster``'s and ``scripts/test-on-cluster``'s."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    start = PORTS.start + 20 * n + (10 if second else 0)
    if start + NODES > PORTS.stop - 20:
        raise RuntimeError(f"no cluster ports left for xdist worker {worker} in {PORTS}")
    return range(start, start + NODES)


class LocalCluster:
    def __init__(self, workdir: Path, ports: range | None = None) -> None:
        self.workdir = workdir
        self.ports = list(ports or worker_block())
        self.procs: dict[int, subprocess.Popen] = {}
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise ClusterUnsupported("redis-server or redis-cli is not installed")
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            for port in self.ports:
                self.start_node(port)
            self._create()
        except BaseException:
            self.stop()
            raise

    # -- nodes ---------------------------------------------------------------------------

    def start_node(self, port: int) -> None:
        """Start (or restart, empty) the node on ``port``: it forgets its cluster config, so a
        restarted node must be re-introduced with ``meet``."""
        node_dir = self.workdir / str(port)
        shutil.rmtree(node_dir, ignore_errors=True)
        node_dir.mkdir(parents=True)
        log = node_dir / "redis.log"
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(node_dir), "--logfile", str(log),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.procs[port] = proc
        wait_until(lambda: proc.poll() is not None or self._answers(port), 20, 0.05)
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")
            text = err + (log.read_text() if log.exists() else "")
            if "cluster" in text.lower() and (
                "bad directive" in text.lower() or "unsupported" in text.lower()
            ):
                raise ClusterUnsupported(f"redis-server has no cluster mode: {text.strip()}")
            raise RuntimeError(f"redis-server on port {port} exited: {text.strip()}")
        if not self._answers(port):
            raise RuntimeError(f"redis-server on port {port} did not answer")

    def cli(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["redis-cli", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def node_cmd(self, port: int, *args: str) -> str:
        return self.cli("-h", "127.0.0.1", "-p", str(port), *args, timeout=30).strip()

    def _answers(self, port: int) -> bool:
        try:
            return self.node_cmd(port, "PING") == "PONG"
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def _create(self) -> None:
        addresses = [f"127.0.0.1:{p}" for p in self.ports]
        self.cli("--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes")
        if not wait_until(self.healthy, 120, 0.1):
            raise RuntimeError(f"cluster on {self.ports} did not reach cluster_state:ok")

    def info(self, port: int) -> dict[str, str]:
        text = self.node_cmd(port, "CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def healthy(self) -> bool:
        """Every running node says ``cluster_state:ok`` and knows every slot, and there are
        three masters each with a replica linked: what a failover needs."""
        try:
            for port, proc in self.procs.items():
                if proc.poll() is None:
                    info = self.info(port)
                    if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                        return False
            return len(self.masters()) == 3 and all(self.replicas_linked().values())
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def nodes(self) -> list[dict[str, str]]:
        """``CLUSTER NODES`` of a live node: id, port, flags, master id, link state, slots."""
        port = next(p for p, proc in self.procs.items() if proc.poll() is None)
        rows = []
        for line in self.node_cmd(port, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            rows.append({
                "id": parts[0], "port": parts[1].split("@")[0].rsplit(":", 1)[1],
                "flags": parts[2], "master": parts[3], "link": parts[7],
                "slots": " ".join(parts[8:]),
            })  # fmt: skip
        return rows

    def masters(self) -> list[int]:
        return [int(n["port"]) for n in self.nodes()
                if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]]  # fmt: skip

    def replicas_linked(self) -> dict[int, bool]:
        """Each live master's port -> whether a live replica of it reports its link up."""
        rows = self.nodes()
        by_id = {n["id"]: n for n in rows}
        linked = {port: False for port in self.masters()}
        for n in rows:
            master = by_id.get(n["master"])
            if "slave" in n["flags"] and "fail" not in n["flags"] and master:
                port = int(n["port"])
                if self.procs.get(port) and self.procs[port].poll() is None:
                    role = self.node_cmd(port, "INFO", "replication")
                    if "master_link_status:up" in role:
                        linked[int(master["port"])] = True
        return linked

    def master_of(self, key: str) -> int:
        slot = int(self.node_cmd(self.masters()[0], "CLUSTER", "KEYSLOT", key))
        for row in self.nodes():
            if "master" not in row["flags"] or "fail" in row["flags"]:
                continue
            for part in row["slots"].split():
                if part.startswith("["):
                    continue  # a slot being migrated or imported
                lo, _, hi = part.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return int(row["port"])
        raise RuntimeError(f"no master owns slot {slot}")

    def node_id(self, port: int) -> str:
        return self.node_cmd(port, "CLUSTER", "MYID")

    def migrate_slot(self, key: str, to_port: int, batch: int = 20) -> int:
        """Move ``key``'s slot to the master on ``to_port`` as ``redis-cli --cluster reshard``
        does (IMPORTING/MIGRATING, MIGRATE in batches, SETSLOT NODE on every master), with the
        slot's keys split between both nodes for the whole move. Returns the keys moved."""
        src = self.master_of(key)
        slot = self.node_cmd(src, "CLUSTER", "KEYSLOT", key)
        src_id, dst_id = self.node_id(src), self.node_id(to_port)
        self.node_cmd(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        self.node_cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while True:
            keys = self.node_cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, str(batch)).split()
            if not keys:
                break
            reply = self.node_cmd(
                src, "MIGRATE", "127.0.0.1", str(to_port), "", "0", "5000", "KEYS", *keys
            )
            if reply not in ("OK", "NOKEY"):
                raise RuntimeError(f"MIGRATE of slot {slot}: {reply}")
            moved += len(keys)
        for port in [to_port, src, *(p for p in self.masters() if p not in (src, to_port))]:
            self.node_cmd(port, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def replica_of(self, master_port: int) -> int:
        rows = self.nodes()
        master_id = next(n["id"] for n in rows if int(n["port"]) == master_port)
        return next(int(n["port"]) for n in rows if n["master"] == master_id)

    def pause(self, port: int) -> None:
        """SIGSTOP one node: it answers nothing, replicates nothing, until ``resume``."""
        self.procs[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGCONT)

    def replicated(self, master_port: int, timeout_ms: int = 10000) -> bool:
        """Whether every write the master acknowledged so far reached its replica (``WAIT``)."""
        return int(self.node_cmd(master_port, "WAIT", "1", str(timeout_ms))) >= 1

    def cut_replication(self, master_port: int) -> int:
        """Close the master's link to its replica (``CLIENT KILL TYPE replica``); returns the
        links closed. Call it with the replica paused: a running replica reconnects at once
        and catches up from the backlog. A paused one cannot, so every write the master
        acknowledges from here on exists on the master only, whatever the kernel buffers
        (SIGSTOP alone loses nothing on loopback: the replica reads the buffered stream when it
        resumes). This is a replica lagging by exactly the writes after the cut."""
        import redis

        # Straight from this process, not through redis-cli: on a loaded machine starting a
        # redis-cli takes long enough to blur where the cut falls among the writes.
        with redis.Redis(host="127.0.0.1", port=master_port, socket_timeout=30) as node:
            return int(node.execute_command("CLIENT", "KILL", "TYPE", "replica"))

    def takeover(self, replica_port: int) -> None:
        """Promote ``replica_port`` now (``CLUSTER FAILOVER TAKEOVER``: no vote, no wait for
        the node timeout), as an operator does when the master is known dead."""
        reply = self.node_cmd(replica_port, "CLUSTER", "FAILOVER", "TAKEOVER")
        if reply != "OK":
            raise RuntimeError(f"CLUSTER FAILOVER TAKEOVER on {replica_port}: {reply}")

    def kill(self, port: int) -> None:
        """SIGKILL one node (a crashed master: no goodbye to its replica)."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused node cannot act on SIGTERM
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stderr:
                proc.stderr.close()
