"""``enqueue_dataframe``: bulk enqueue from a Spark DataFrame, on the executors.

Why on the executors: the rows never travel through the driver, so a billion-row DataFrame
enqueues at the speed of its partitions. Each partition opens its own Queue (Django is set up in
the executor's Python worker from ``DJANGO_SETTINGS_MODULE``) and sends ``enqueue_many`` batches,
which the Redis backend pipelines.

Why it is safe to retry: every job carries the id from ``id_col``, and the queue deduplicates
ids. A task that Spark re-runs after a failure, or a whole call repeated after a crash, finds the
jobs already stored and counts them as duplicates; none is stored twice.

Why nothing is sent until every row is known to be accepted: a row the queue refuses (a NaN or
an infinity in a float column, a NUL in a string, a payload over ``MAX_PAYLOAD_BYTES``) would
otherwise fail its task after the batches before it were stored, leaving a partial enqueue. So
a first pass builds every job on the executors with the queue's own validation
(``Queue.build``), nothing stored, and the call refuses the DataFrame, naming the first rows
and why, when one fails; only then does the second pass send. The price is reading the
DataFrame twice (``df.cache()`` first when it is expensive to compute).

Why counts are exact under task retries: they are accumulators updated inside an action
(``foreachPartition``), and Spark applies each task's updates once, however often it ran.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegralType,
    MapType,
    NullType,
    StringType,
    StructType,
)

from ...errors import InvalidOption, InvalidPayload, JobQError
from ...queue.core import Queue, get_queue
from ...validation import validate_queue_name

ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$"  # validation.validate_job_id, for Spark
OUTCOMES = ("queued", "duplicate", "completed", "updated")


@dataclass(frozen=True)
class EnqueueCounts:
    """How the rows ended: ``queued`` new jobs, ``duplicate`` ids already waiting or running,
    ``completed`` ids that already completed (not run again), ``updated`` waiting jobs updated in
    place (only with the ``update_*`` options)."""

    queued: int = 0
    duplicate: int = 0
    completed: int = 0
    updated: int = 0

    @property
    def total(self) -> int:
        return self.queued + self.duplicate + self.completed + self.updated


def _json_safe(kind: DataType) -> bool:
    if isinstance(
        kind, StringType | BooleanType | IntegralType | FloatType | DoubleType | NullType
    ):
        return True
    if isinstance(kind, ArrayType):
        return _json_safe(kind.elementType)
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and _json_safe(kind.valueType)
    if isinstance(kind, StructType):
        return all(_json_safe(f.dataType) for f in kind.fields)
    return False


def _check_columns(df: DataFrame, id_col: str, payload_cols: Sequence[str]) -> None:
    missing = [c for c in (id_col, *payload_cols) if c not in df.columns]
    if missing:
        raise InvalidOption(f"no such column(s) {missing}; the DataFrame has {df.columns}")
    types = {f.name: f.dataType for f in df.schema.fields}
    if not isinstance(types[id_col], StringType):
        raise InvalidOption(f"id column {id_col!r} must be a string, not {types[id_col]}")
    unsafe = {c: str(types[c]) for c in payload_cols if not _json_safe(types[c])}
    if unsafe:
        raise InvalidOption(
            f"payload column(s) {unsafe} have no JSON form: cast them (dates and decimals to "
            "strings, binaries to base64) before enqueueing"
        )


def _check_ids(df: DataFrame, id_col: str) -> None:
    """Refuse the whole DataFrame when one id is invalid, before any job is sent: a task that
    failed on row 10,000 of its partition would leave the first 9,999 enqueued."""
    bad = df.where(F.col(id_col).isNull() | ~F.col(id_col).rlike(ID_PATTERN))
    sample = [r[0] for r in bad.select(id_col).limit(5).collect()]
    if sample:
        raise InvalidOption(
            f"column {id_col!r} holds invalid job ids (A-Z a-z 0-9 _ . -, 1 to 128 characters, "
            f"not starting with . or -), e.g. {sample}"
        )


def _setup_django(settings_module: str | None) -> None:
    from django.apps import apps

    if apps.ready:
        return
    if settings_module:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise RuntimeError(
            "enqueue_dataframe: DJANGO_SETTINGS_MODULE is not set on the executor; set it on "
            "the driver (it is passed on) or with spark.executorEnv.DJANGO_SETTINGS_MODULE"
        )
    import django

    django.setup()


def _send(queue: Queue, batch: list[dict[str, Any]], accumulators: Mapping[str, Any]) -> None:
    tally = dict.fromkeys(OUTCOMES, 0)
    for result in queue.enqueue_many(batch):
        tally[result.outcome.value] += 1
    for outcome, n in tally.items():
        if n:
            accumulators[outcome].add(n)


def _refused_rows(
    rows: Iterable[Any],
    *,
    queue_name: str,
    id_col: str,
    payload_cols: Sequence[str],
    options: Mapping[str, Any],
    make_queue: Callable[[str], Queue] | None,
    settings_module: str | None,
) -> Iterator[tuple[str, str]]:
    """(id, why) of each row of the partition the queue would refuse; stores nothing."""
    _setup_django(settings_module)
    queue = (make_queue or get_queue)(queue_name)
    for row in rows:
        values = row.asDict(recursive=True)
        try:
            queue.build(values[id_col], {c: values[c] for c in payload_cols}, **options)
        except JobQError as exc:
            yield values[id_col], str(exc)


def _enqueue_partition(
    rows: Iterable[Any],
    *,
    queue_name: str,
    id_col: str,
    payload_cols: Sequence[str],
    options: Mapping[str, Any],
    batch: int,
    make_queue: Callable[[str], Queue] | None,
    settings_module: str | None,
    accumulators: Mapping[str, Any],
) -> None:
    _setup_django(settings_module)
    queue = (make_queue or get_queue)(queue_name)
    pending: list[dict[str, Any]] = []
    for row in rows:
        values = row.asDict(recursive=True)  # nested structs as dicts, not JSON arrays
        payload = {c: values[c] for c in payload_cols}
        pending.append({"id": values[id_col], "payload": payload, **options})
        if len(pending) >= batch:
            _send(queue, pending, accumulators)
            pending = []
    if pending:
        _send(queue, pending, accumulators)


def enqueue_dataframe(
    df: DataFrame,
    queue: str,
    id_col: str,
    payload_cols: Sequence[str] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    batch: int = 500,
    make_queue: Callable[[str], Queue] | None = None,
    settings_module: str | None = None,
) -> EnqueueCounts:
    """Enqueue one job per row of ``df`` into ``queue``, from the executors.

    Args:
        id_col: string column with each job's id (the deduplication key).
        payload_cols: columns that form the JSON payload ``{column: value}`` (default: every
            column but ``id_col``). Types must have a JSON form.
        options: job options for every job (``priority``, ``max_attempts``, ``delay``…).
        batch: jobs per ``enqueue_many`` call (one pipelined round trip on Redis).
        make_queue: builds the Queue on each executor (default ``get_queue``: the ``JOBQ``
            setting); must be picklable, e.g. a module-level function.
        settings_module: Django settings for the executors (default: the driver's
            ``DJANGO_SETTINGS_MODULE``).

    Returns:
        The counts of each outcome. Rerunning the call enqueues only what is missing.

    Raises:
        InvalidOption: a missing column, a payload type without JSON form, an invalid id or
            option; nothing has been enqueued then.
        InvalidPayload: a row whose payload the queue refuses (NaN or infinity, NUL, too
            large), named with its id; nothing has been enqueued then.
    """
    validate_queue_name(queue)
    if batch < 1:
        raise InvalidOption("batch must be at least 1")
    cols = (
        list(payload_cols) if payload_cols is not None else [c for c in df.columns if c != id_col]
    )
    _check_columns(df, id_col, cols)
    opts = dict(options or {})
    (make_queue or get_queue)(queue).build("probe", None, **opts)  # options valid? no write
    _check_ids(df, id_col)
    rows = df.select(id_col, *cols)
    common: dict[str, Any] = {
        "queue_name": queue, "id_col": id_col, "payload_cols": cols, "options": opts,
        "make_queue": make_queue,
        "settings_module": settings_module or os.environ.get("DJANGO_SETTINGS_MODULE"),
    }  # fmt: skip
    refused = rows.rdd.mapPartitions(functools.partial(_refused_rows, **common)).take(5)
    if refused:
        listed = "; ".join(f"{job_id!r}: {why}" for job_id, why in refused)
        raise InvalidPayload(f"rows the queue refuses, nothing enqueued (e.g. {listed})")
    sc = df.sparkSession.sparkContext
    accumulators = {outcome: sc.accumulator(0) for outcome in OUTCOMES}
    rows.foreachPartition(
        functools.partial(_enqueue_partition, batch=batch, accumulators=accumulators, **common)
    )
    return EnqueueCounts(**{outcome: acc.value for outcome, acc in accumulators.items()})
