"""Request/response against the hand-off, two checkouts alternated in the same minutes.

    python -m bench.rr_compare --other /path/to/other/checkout [--rounds 3] [--blocks 10]

Each round runs ``bench.core.measure_rr_vs_handoff`` (``--blocks`` blocks of 50
``enqueue_and_wait`` calls alternated with 50 LPUSH→BRPOP ping-pongs, worker ``--concurrency
8``) once from the other checkout's code, then once from this one's, each in its own process
whose worker is a ``runworker`` of that checkout. Why alternate: on a shared machine the load
moves by several times within minutes, so a before/after measured minutes apart compares loads,
not code; alternating rounds see the same load on average, and each figure is already a ratio
to the hand-off of its own blocks. One JSON object per run on stdout as it ends, then a summary
object (median of the rounds per side, load average beside each). Nothing is written into
either checkout (no bytecode: ``PYTHONDONTWRITEBYTECODE``); every run uses its own key prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.core import ROOT, log

FIELDS = ("handoff_p50_us", "handoff_p99_vs_handoff_p50", "rr_p50_vs_handoff_p50",
          "rr_p99_vs_handoff_p50", "client_cpu_us_per_rr", "client_user_cpu_us_per_rr",
          "worker_cpu_us_per_rr", "rr_p99_after_first_vs_handoff_p50")  # fmt: skip


def one_side(blocks: int) -> dict[str, Any]:
    """In the child: one interleaved measurement of the checkout this process imports."""
    from bench import core

    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    core.setup_django(prefix)
    client = core.redis_client()
    load = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="jobq-rrc-") as tmp:
            result = core.measure_rr_vs_handoff(blocks, 50, prefix, Path(tmp))
    finally:
        core.delete_matching(client, core.run_pattern(prefix))
    return {
        **{key: result.get(key, 0) for key in FIELDS},  # an older bench/core.py: no CPU
        "rr_p50_us": result["rr_us"]["p50"],
        "rr_p99_us": result["rr_us"]["p99"],
        "loadavg": round((load + os.getloadavg()[0]) / 2, 2),
    }


def run_side(checkout: Path, blocks: int) -> dict[str, Any]:
    """This module's ``--side`` mode in a process whose imports come from ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}
    # The runner is this file, so a checkout without it can be measured too.
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", "--blocks", str(blocks)]
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                         timeout=900, check=True).stdout  # fmt: skip
    return {"checkout": str(checkout), **json.loads(out.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Alternate the two checkouts ``--rounds`` times and print the runs and their medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, help="the checkout to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        result = one_side(args.blocks)
        print(json.dumps(result), flush=True)
        return result
    if args.other is None:
        parser.error("--other is required")
    sides = {"other": args.other.resolve(), "this": ROOT}
    runs: dict[str, list[dict[str, Any]]] = {"other": [], "this": []}
    for i in range(args.rounds):
        for name, checkout in sides.items():
            log(f"round {i + 1}: {name} ({checkout})")
            runs[name].append(run_side(checkout, args.blocks))
            print(json.dumps({"side": name, **runs[name][-1]}), flush=True)
    summary = {
        name: {key: statistics.median(r[key] for r in rs) for key in (*FIELDS, "loadavg")}
        for name, rs in runs.items()
    }
    print(json.dumps({"summary": summary}), flush=True)
    return summary


if __name__ == "__main__":
    if "--side" in sys.argv:  # the child: bench.core from the checkout on PYTHONPATH
        sys.path.insert(0, os.getcwd())
    main()
