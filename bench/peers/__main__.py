"""Peer benchmark: Celery, RQ, Dramatiq, arq and BullMQ against django_jobq, in one go.

    python -m bench.peers [--quick] [--rounds 3] [--peers celery,rq,...] [--redis-url URL]

1. Creates one virtual environment per peer under ``bench/peers/.venv/<peer>`` (gitignored)
   from the pinned ``bench/peers/requirements/<peer>.txt`` (each peer gets the redis-py its own
   pins allow: arq needs redis < 6, BullMQ >= 6.2, so they cannot share one), plus one for
   matplotlib (the chart). Re-created only when a requirements file changes. Nothing is
   installed into the project's environment.
2. Runs the same workloads for every system, each in a subprocess (a peer's in its own
   venv, django_jobq's in this one through bench/core.py): enqueue one by one, bulk enqueue,
   drain of 10,000 no-op jobs by 1 and by 4 worker processes, 500 sequential request/response
   calls. Rounds are interleaved (round 1: every system, round 2: every system in a rotated
   order...), so a burst of other load hits everyone alike; each figure is the median of the
   rounds. The Redis database of ``--redis-url`` (default db 5) is flushed before every
   workload: only that database, and never db 0.
3. Prints one JSON line per measurement and a final summary line on stdout (progress and the
   table on stderr), writes ``bench/peers/results.json`` and renders the table as a chart
   (``docs/benchmarks-peers.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.peers import report

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = ROOT / "bench" / "peers"
VENVS = HERE / ".venv"
PEERS = ("celery", "rq", "dramatiq", "arq", "bullmq")
# ``--db postgres``: the database-backed peers against django_jobq's database backend, each
# system in a PostgreSQL database of its own (bench/peers/pg.py).
DB_PEERS = ("procrastinate", "django_tasks_db")
NAMES = {"celery": "Celery", "rq": "RQ", "dramatiq": "Dramatiq", "arq": "arq",
         "bullmq": "BullMQ", "procrastinate": "Procrastinate",
         "django_tasks_db": "Django Tasks (django-tasks-db)", "jobq": report.REFERENCE}  # fmt: skip
# The drain and request/response sizes are bench/core.py's; the enqueue figures are rates that
# settle within a few thousand calls, so they use fewer jobs than bench/core.py (20,000 and
# 100,000) to keep the slowest peers' rounds short.
FULL = {"enqueue_one": 5_000, "enqueue_bulk": 20_000, "drain": 10_000, "rr": 500, "warmup": 50}
QUICK = {"enqueue_one": 2_000, "enqueue_bulk": 10_000, "drain": 2_000, "rr": 200, "warmup": 20}
DRAIN_PROCESSES = (1, 4)
WORKLOAD_TIMEOUT = 900


def log(message: str) -> None:
    print(f"[bench.peers] {message}", file=sys.stderr, flush=True)


# -- virtual environments ---------------------------------------------------------------------


def find_python() -> str:
    """A Python >= 3.12 for the peers' venvs: the one the project's own set-up uses."""
    try:
        found = subprocess.run([str(ROOT / "scripts" / "find-python")], capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        found = ""
    return found or sys.executable


def ensure_venv(name: str) -> Path:
    """``bench/peers/.venv/<name>`` with ``requirements/<name>.txt`` installed; returns its
    python. Skipped when the venv was built from the same requirements text."""
    venv = VENVS / name
    requirements = HERE / "requirements" / f"{name}.txt"
    wanted = requirements.read_text()
    marker = venv / ".requirements"
    python = venv / "bin" / "python"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log(f"creating {venv.relative_to(ROOT)} from {requirements.relative_to(ROOT)}")
    subprocess.run([find_python(), "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-r", str(requirements)], check=True)  # fmt: skip
    marker.write_text(wanted)
    return python


# -- one workload -----------------------------------------------------------------------------


def workload_args(workload: str, processes: int, sizes: dict[str, int], log_dir: Path) -> list:
    args = [workload, "--jobs", str(sizes[workload]), "--log-dir", str(log_dir)]
    if workload == "drain":
        args += ["--processes", str(processes)]
    if workload == "rr":
        args += ["--warmup", str(sizes["warmup"])]
    return args


def run_workload(
    system: str, python: Path, workload: str, processes: int, opts: argparse.Namespace,
    log_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """One workload of one system in a fresh subprocess, after flushing the run's database."""
    flush(opts.redis_url)
    wl_args = workload_args(workload, processes, opts.sizes, log_dir / system)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PEERBENCH_REDIS_URL": opts.redis_url,
           "JOBQ_BENCH_REDIS_URL": opts.redis_url,
           "JOBQ_BENCH_SQLITE": str(log_dir / "jobq-bench.sqlite3")}  # fmt: skip
    if opts.db:  # django_jobq's database backend, in a database named like the peers'
        env |= {"JOBQ_PEER_DB": opts.db, "PEERBENCH_PG_PREFIX": opts.pg_prefix,
                "JOBQ_BENCH_PG_DB": f"{opts.pg_prefix}jobq"}  # fmt: skip
    if system == "jobq":
        command = [str(python), "-m", "bench.peers.jobq_peer", *wl_args]
    else:
        command = [str(python), "-m", "bench.peers.common", system, *wl_args]
    name = f"drain_{processes}" if workload == "drain" else workload
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=WORKLOAD_TIMEOUT)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-1500:]}")
        record = json.loads(lines[-1])
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        log(f"{NAMES[system]} {name} failed: {exc}")
        record = {"system": NAMES[system], "workload": name, "value": None, "error": str(exc)}
    record["wall_s"] = round(time.perf_counter() - started, 2)
    return record


def flush(url: str) -> None:
    """FLUSHDB on the run's own database (never db 0, which is everyone's default)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


# -- the whole run ----------------------------------------------------------------------------


def machine(url: str) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        redis_version = client.info("server").get("redis_version")
    finally:
        client.close()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "redis_server": redis_version}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs, one round (smoke run)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds, median reported (3)")
    parser.add_argument("--peers", help="comma-separated subset (default: every peer)")
    parser.add_argument(
        "--db", choices=("postgres",), help="database peers against django_jobq's database backend"
    )
    parser.add_argument("--pg-prefix", default="test_jobq_peers_",
                        help="--db: each system's database is PREFIX<system>")  # fmt: skip
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="database flushed before every workload (not db 0)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="default results.json (results-db.json: --db)")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "benchmarks-peers.png")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    opts = parser.parse_args(argv)
    opts.rounds = opts.rounds or (1 if opts.quick else 3)
    opts.sizes = QUICK if opts.quick else FULL
    known = DB_PEERS if opts.db else PEERS
    opts.peers = [p for p in (opts.peers or ",".join(known)).split(",") if p]
    unknown = set(opts.peers) - set(known)
    if unknown:
        parser.error(f"unknown peer(s) {sorted(unknown)}; known: {', '.join(known)}")
    opts.out = opts.out or HERE / ("results-db.json" if opts.db else "results.json")
    opts.no_chart = opts.no_chart or bool(opts.db)  # the chart draws the Redis comparison
    db = (urlparse(opts.redis_url).path or "/0").lstrip("/") or "0"
    if db == "0":
        parser.error("--redis-url must name a database other than 0: it is flushed")
    return opts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = parse_args(argv)
    began = time.perf_counter()
    command = "python -m bench.peers " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    pythons = {peer: ensure_venv(peer) for peer in opts.peers}
    pythons["jobq"] = Path(sys.executable)
    systems = [*opts.peers, "jobq"]
    records: list[dict[str, Any]] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="jobq-peers-") as tmp:
        for round_index in range(opts.rounds):
            shift = round_index % len(systems)
            order = systems[shift:] + systems[:shift]  # rotated: no system is always first
            loads.append(os.getloadavg()[0])
            log(f"round {round_index + 1}/{opts.rounds}: {', '.join(NAMES[s] for s in order)} "
                f"(load average {loads[-1]:.1f})")  # fmt: skip
            for system in order:
                drains = (1,) if opts.db else DRAIN_PROCESSES
                for workload, processes in [("enqueue_one", 1), ("enqueue_bulk", 1),
                                            *(("drain", p) for p in drains),
                                            ("rr", 1)]:  # fmt: skip
                    record = run_workload(system, pythons[system], workload, processes, opts,
                                          Path(tmp))  # fmt: skip
                    record["round"] = round_index + 1
                    records.append(record)
                    print(json.dumps(record), flush=True)
                    shown = record.get("na") and "n/a" or record.get("value")
                    log(f"  {NAMES[system]} {record['workload']}: {shown} "
                        f"({record['wall_s']} s)")  # fmt: skip
        flush(opts.redis_url)
    summary = report.summarise(records)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "quick": opts.quick,
        "rounds": opts.rounds,
        "sizes": opts.sizes,
        "machine": machine(opts.redis_url),
        "load_average_before_rounds": loads,
        "wall_seconds": round(time.perf_counter() - began, 1),
        "versions": {r["system"]: r.get("version") for r in records if r.get("version")},
        "settings": {r["system"]: r.get("settings") for r in records if r.get("settings")},
        "summary": summary,
        "ratios": report.ratios(summary),
        "not_available": report.not_available(summary),
        "table_markdown": report.table(summary),
        "records": records,
    }
    print(json.dumps({k: result[k] for k in ("summary", "ratios", "not_available")}), flush=True)
    log("\n" + result["table_markdown"])
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {opts.out}")
    if not opts.no_chart:
        chart_python = ensure_venv("chart")
        subprocess.run([str(chart_python), "-m", "bench.peers.chart", str(opts.out),
                        str(opts.chart)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       check=True)  # fmt: skip
        log(f"wrote {opts.chart}")
    return result


if __name__ == "__main__":
    main()
