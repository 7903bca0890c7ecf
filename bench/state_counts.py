"""What the per-state count triggers (migration 0031, ``StateCount``) cost the database backend's
hot path: the same figures with the triggers on and off, interleaved, in one run.

    python -m bench.state_counts --db postgres|sqlite [--rounds 4] [--one 1000]
                                 [--bulk 20000] [--drain 5000] [--out FILE]

Each round measures, triggers on and then off (the order alternates from round to round),
``enqueue_one_per_s`` (sequential ``Queue.enqueue``), ``enqueue_bulk_per_s`` (``enqueue_many``
in chunks of 1,000) and ``drain_per_s`` (queued no-op jobs, one ``runworker -c 8`` subprocess,
spawn to last completion, as ``bench.core_db``). Off: PostgreSQL ``ALTER TABLE … DISABLE
TRIGGER``; SQLite has no such switch, so its triggers are dropped and made again from the
migration's own statements; after each switch a short warm-up of both enqueues runs unmeasured
(the switch makes every cached plan of the table re-plan). The summary is each figure's median
ratio on/off (1.0: free).
Runs in the database ``bench.core_db`` uses (``JOBQ_BENCH_PG_DB`` / ``JOBQ_BENCH_SQLITE``);
the counts are taken anew after every "off" phase.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import core_db
from bench.core import QUEUE, log, running_workers, wait_for

MIGRATION = importlib.import_module("django_jobq.migrations.0031_statecount")


def switch(on: bool) -> None:
    from django.apps import apps
    from django.db import connection

    from django_jobq.storage.database.operations import recount

    names = MIGRATION.tables(apps, connection.schema_editor())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for name in MIGRATION.NAMES:
                verb = "ENABLE" if on else "DISABLE"
                cursor.execute(f"ALTER TABLE {names['jobs']} {verb} TRIGGER {name}")
        else:
            for name in MIGRATION.NAMES:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            if on:
                for sql in MIGRATION.SQLITE_TRIGGERS:
                    cursor.execute(sql.format(**names))
    if on:  # what the "off" phase wrote went uncounted
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"DELETE FROM {names['counts']}")  # noqa: S608 - model table
                cursor.execute(MIGRATION.FILL.format(**names))
        else:
            recount("default")


def drain(n: int, tag: str, log_dir: Path) -> float:
    """jobs/s from spawning one worker to the last completion, read from the rows (the counts
    are what is being switched)."""
    from django_jobq.models import Job
    from django_jobq.queue import Queue

    core_db.reset()
    queue = Queue(QUEUE)
    for offset in range(0, n, 1000):
        queue.enqueue_many([(f"{tag}-{i}", {"n": 1}) for i in range(offset, min(n, offset + 1000))])
    core_db.analyze()
    done = Job.objects.filter(queue=QUEUE, state="completed")
    spawn = time.time()
    with running_workers(8, 1, log_dir):
        wait_for(lambda: done.count() >= n, 600, f"{n} jobs to complete")
    _, _, _, last = core_db._done(f"{tag}-")
    core_db.reset()
    if last is None:
        raise RuntimeError("no completion recorded")
    return round(n / (last - spawn), 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--one", type=int, default=1000)
    parser.add_argument("--bulk", type=int, default=20_000)
    parser.add_argument("--drain", type=int, default=5000)
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args(argv)
    core_db.setup(opts.db)
    log_dir = Path(tempfile.mkdtemp(prefix="jobq-bench-counts-"))
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(opts.rounds):
            row: dict[str, Any] = {}
            for on in (True, False) if r % 2 == 0 else (False, True):
                switch(on)
                # Switching invalidates the table's cached plans and prepared statements:
                # the first statements after it re-plan. Not the triggers' cost: warm up.
                core_db.measure_enqueue_one(200)
                core_db.measure_enqueue_bulk(2000, 1000)
                mode = "on" if on else "off"
                row[f"enqueue_one_{mode}"] = core_db.measure_enqueue_one(opts.one)["per_s"]
                row[f"enqueue_bulk_{mode}"] = core_db.measure_enqueue_bulk(opts.bulk, 1000)["per_s"]
                row[f"drain_{mode}"] = drain(opts.drain, f"counts-{r}-{mode}", log_dir)
            rounds.append(row)
            log(json.dumps(row))
    finally:
        switch(True)
    return report(opts, rounds, ("enqueue_one", "enqueue_bulk", "drain"), "on", "off")


def report(
    opts: argparse.Namespace, rounds: list[dict[str, Any]], figures: tuple[str, ...],
    a: str, b: str, **fields: Any,
) -> dict[str, Any]:  # fmt: skip
    """Each figure's median ratio ``a``/``b`` over the rounds (``ratio_<a>_<b>``), with the
    rounds, as one JSON object on stdout (and in ``--out``)."""
    ratios = {
        figure: round(statistics.median(r[f"{figure}_{a}"] / r[f"{figure}_{b}"] for r in rounds), 3)
        for figure in figures
    }
    result = {"db": opts.db, **fields, "rounds": rounds, f"ratio_{a}_{b}": ratios}
    print(json.dumps(result, indent=1))
    if opts.out:
        opts.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
