"""``jobq_export``: the job and event history as Parquet, partitioned by queue and date.

Layout under the target directory (Hive-style partitions that Spark, pandas and DuckDB read)::

    events/queue=<queue>/date=<YYYY-MM-DD>/part-e<first event pk>.parquet
    jobs/queue=<queue>/date=<YYYY-MM-DD of finished_at>/part-e<first event pk>.parquet

Why it is incremental and safe to rerun: events are read in primary-key order, ``chunk`` rows at
a time (keyset pagination: bounded memory on any table size), and the watermark
(``ExportWatermark``) moves after each chunk's files are in place. A file's name is derived
from the first row of its chunk and written by rename, so a run that died between a file and
its watermark rewrites the same file with the same rows instead of adding a second copy.

Why ``settle``: an event row becomes visible when its transaction commits, not when its id is
taken. Only ids up to the newest event at least ``settle`` seconds old are exported; a
transaction that stays open longer than that and then commits an older id would be missed
(``--full`` rewrites everything). A job is written when its terminal event (completed, failed,
cancelled) is: once per run of it, as it stands at export time.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from django.db import transaction
from django.db.models import Max

from ...models import ExportWatermark, Job, JobEvent
from ...states import TERMINAL_STATES
from ...validation import logical_name
from .schema import MESSAGE_CHARS

TERMINAL_KINDS = tuple(s.value for s in TERMINAL_STATES)
IN_BATCH = 10_000  # ids per IN (...): SQLite allows 32,766 bound parameters per statement
TS = pa.timestamp("us", tz="UTC")
EVENT_ARROW = pa.schema(
    [
        ("event_id", pa.int64()), ("job_pk", pa.int64()), ("job_id", pa.string()),
        ("handler", pa.string()), ("kind", pa.string()), ("at", TS), ("worker", pa.string()),
        ("error_type", pa.string()), ("error_message", pa.string()),
    ]
)  # fmt: skip
JOB_ARROW = pa.schema(
    [
        ("job_pk", pa.int64()), ("job_id", pa.string()), ("handler", pa.string()),
        ("state", pa.string()), ("attempts", pa.int64()), ("stalls", pa.int64()),
        ("priority", pa.int64()), ("created_at", TS), ("started_at", TS), ("finished_at", TS),
        ("worker", pa.string()), ("error_type", pa.string()), ("error_message", pa.string()),
    ]
)  # fmt: skip


@dataclass
class ExportResult:
    events: int = 0
    jobs: int = 0
    files: int = 0
    last_event_id: int = 0


def _error_parts(error: Any) -> tuple[str | None, str | None]:
    if not isinstance(error, dict):
        return None, None
    message = error.get("message")
    return (
        str(error.get("type") or "Unknown"),
        None if message is None else str(message)[:MESSAGE_CHARS],
    )


def _write(root: Path, dataset: str, name: str, schema: pa.Schema, rows: dict) -> int:
    """Write one file per (queue, date) of ``rows`` (column lists keyed by partition)."""
    files = 0
    for (queue, day), columns in rows.items():
        folder = root / dataset / f"queue={queue}" / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"part-{name}.parquet"
        tmp = folder / f".{final.name}.{uuid.uuid4().hex}.tmp"
        pq.write_table(pa.table(columns, schema=schema), tmp)
        os.replace(tmp, final)  # readers never see half a file
        files += 1
    return files


def _event_chunks(
    using: str, after: int, bound: int, since: dt.datetime | None, chunk: int
) -> Iterator[list[tuple]]:
    fields = ("id", "queue", "job_id", "job__job_id", "job__handler", "kind", "at", "worker")
    base = JobEvent.objects.using(using).filter(id__lte=bound).order_by("id")
    if since is not None:
        base = base.filter(at__gte=since)
    while True:
        rows = list(base.filter(id__gt=after).values_list(*fields, "job__error")[:chunk])
        if not rows:
            return
        yield rows
        after = rows[-1][0]


def _columns(names: Sequence[str], groups: dict[tuple[str, str], list[tuple]]) -> dict:
    """Rows per partition → column lists per partition (one transpose, not an append per
    value: this loop runs for every exported row)."""
    return {
        key: dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))
        for key, rows in groups.items()
    }


def _day(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).date().isoformat()


def _event_columns(rows: Sequence[tuple]) -> dict:
    groups: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for pk, queue, job_pk, job_id, handler, kind, at, worker, error in rows:
        etype = message = None
        if kind == "failed":
            etype, message = _error_parts(error)
            etype = etype or "Unknown"  # as the JDBC query says for a failure without error
        # A sharded queue's partitions export as its logical queue (one folder, one name).
        groups[(logical_name(queue), _day(at))].append(
            (pk, job_pk, job_id, handler, kind, at, worker, etype, message)
        )
    return _columns(EVENT_ARROW.names, groups)


def _export_events(
    root: Path, mark: ExportWatermark, using: str, since: dt.datetime | None, cutoff: dt.datetime,
    chunk: int, result: ExportResult,
) -> None:  # fmt: skip
    bound = JobEvent.objects.using(using).filter(at__lte=cutoff).aggregate(m=Max("id"))["m"] or 0
    for rows in _event_chunks(using, mark.last_event_id, bound, since, chunk):
        name = f"e{rows[0][0]}"
        result.files += _write(root, "events", name, EVENT_ARROW, _event_columns(rows))
        jobs = _finished_jobs(using, rows)
        result.files += _write(root, "jobs", name, JOB_ARROW, _job_columns(jobs))
        result.jobs += len(jobs)
        mark.last_event_id = rows[-1][0]
        mark.rows_written += len(rows)
        mark.save(using=using, update_fields=["last_event_id", "rows_written", "updated_at"])
        result.events += len(rows)
    # Nothing in (watermark, bound] matched ``since``: skip past it next time all the same.
    if bound > mark.last_event_id:
        mark.last_event_id = bound
        mark.save(using=using, update_fields=["last_event_id", "updated_at"])
    result.last_event_id = mark.last_event_id


JOB_FIELDS = (
    "finished_at", "id", "queue", "job_id", "handler", "state", "attempts", "stalls", "priority",
    "created_at", "started_at", "worker", "error",
)  # fmt: skip


def _finished_jobs(using: str, events: Sequence[tuple]) -> list[tuple]:
    """The jobs that a terminal event of this chunk finished, as they are now."""
    pks = sorted({row[2] for row in events if row[5] in TERMINAL_KINDS})
    finished = Job.objects.using(using).filter(state__in=TERMINAL_KINDS).exclude(finished_at=None)
    rows: list[tuple] = []
    for start in range(0, len(pks), IN_BATCH):
        batch = finished.filter(pk__in=pks[start : start + IN_BATCH])
        rows += batch.order_by("id").values_list(*JOB_FIELDS)
    return rows


def _job_columns(rows: Sequence[tuple]) -> dict:
    groups: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for finished, pk, queue, job_id, handler, state, attempts, stalls, prio, created, started, \
            worker, error in rows:  # fmt: skip
        etype, message = _error_parts(error)
        groups[(logical_name(queue), _day(finished))].append(
            (pk, job_id, handler, state, attempts, stalls, prio, created, started, finished,
             worker, etype, message)
        )  # fmt: skip
    return _columns(JOB_ARROW.names, groups)


def export_history(
    target: str | os.PathLike[str],
    *,
    since: dt.datetime | None = None,
    using: str = "default",
    chunk: int = 50_000,
    settle: float = 60.0,
    full: bool = False,
) -> ExportResult:
    """Write the events (and finished jobs) not exported yet to ``target`` as Parquet.

    Args:
        since: export nothing older than this (aware datetime).
        using: database alias of the ``Job`` / ``JobEvent`` rows.
        chunk: rows read and written per step; memory is bounded by it.
        settle: seconds an event must be old before its id may move the watermark.
        full: forget the watermark and rewrite the whole history (same files, same names).
    """
    if chunk < 1:
        raise ValueError("chunk must be at least 1")
    if since is not None and since.tzinfo is None:
        raise ValueError("since must be an aware datetime")
    root = Path(target).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settle)
    with transaction.atomic(using=using):
        mark, _ = ExportWatermark.objects.using(using).get_or_create(target=str(root))
    if full:
        # Earlier runs may have cut other chunks: their files go, or rows would be doubled.
        for dataset in ("events", "jobs"):
            shutil.rmtree(root / dataset, ignore_errors=True)
        mark.last_event_id = 0
    result = ExportResult()
    _export_events(root, mark, using, since, cutoff, chunk, result)
    return result
