"""What ``atomic=True`` costs: the drain rate of an atomic no-op handler against the plain
one, database backend, interleaved in one run.

    python -m bench.atomic [--db postgres|sqlite] [--rounds 4] [--jobs 5000] [--concurrency 8]
                           [--out FILE]

Each round drains ``--jobs`` queued no-op jobs with one ``runworker -c N`` (``bench.core_db``'s
``drain_per_s``: spawn to last completion, and ``steady_per_s``: first to last completion),
once with the plain handler and once with ``atomic=True`` (``JOBQ_BENCH_ATOMIC=1`` for the
worker; the order alternates). Why it costs: a plain completion joins the worker's batched
acknowledgements (one statement for many jobs), an atomic one is its own transaction on the
handler's thread, with the handler's writes. ``ratio_atomic_plain`` is each figure's median
ratio (1.0: free).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench import core_db
from bench.core import log
from bench.state_counts import report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args(argv)
    core_db.setup(opts.db)
    log_dir = Path(tempfile.mkdtemp(prefix="jobq-bench-atomic-"))
    rounds: list[dict[str, Any]] = []
    for r in range(opts.rounds):
        row: dict[str, Any] = {}
        for mode in ("plain", "atomic") if r % 2 == 0 else ("atomic", "plain"):
            os.environ["JOBQ_BENCH_ATOMIC"] = "1" if mode == "atomic" else "0"
            drained = core_db.measure_drain(opts.jobs, opts.concurrency, f"{mode}{r}", log_dir)
            row[f"drain_{mode}"] = drained["per_s"]
            row[f"steady_{mode}"] = drained["steady_per_s"]
        rounds.append(row)
        log(json.dumps(row))
    os.environ.pop("JOBQ_BENCH_ATOMIC", None)
    fields = {"jobs": opts.jobs, "concurrency": opts.concurrency}
    return report(opts, rounds, ("drain", "steady"), "atomic", "plain", **fields)


if __name__ == "__main__":
    main()
