"""Where the analytics read the history from: the Parquet export, or PostgreSQL over JDBC.

Both return the same columns (``schema.EVENT_SCHEMA`` less ``date``), so the metrics code does
not know which one it got.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from django.conf import settings
from django.db.models import Max, Min
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ...models import Job, JobEvent
from .schema import EVENT_COLUMNS, EVENT_SCHEMA, MESSAGE_CHARS
from .session import jdbc_jar


class HistoryUnavailable(Exception):
    """The requested history source cannot be read (no export there, no JDBC driver, …)."""


def read_parquet(spark: SparkSession, root: str, since: dt.datetime | None = None) -> DataFrame:
    """Events of a ``jobq_export`` directory (its ``events/`` dataset)."""
    path = Path(root) / "events"
    if not path.is_dir():
        raise HistoryUnavailable(f"{path} does not exist: run manage.py jobq_export --to {root}")
    df = spark.read.schema(EVENT_SCHEMA).parquet(str(path))
    if since is not None:
        # The date filter prunes whole partition directories before any file is opened.
        df = df.where(F.col("date") >= since.astimezone(dt.UTC).date().isoformat())
        df = df.where(F.col("at") >= F.lit(since))
    return df.select(*EVENT_COLUMNS)


def jdbc_options(using: str = "default") -> dict[str, str]:
    """Spark JDBC options for the Django database ``using`` (PostgreSQL only).

    The driver class is named explicitly: Spark would otherwise look it up through
    DriverManager, which misses jars added by ``spark.jars`` on some cluster managers."""
    db = settings.DATABASES[using]
    if "postgresql" not in db["ENGINE"]:
        raise HistoryUnavailable(f"--jdbc reads PostgreSQL; database {using!r} is {db['ENGINE']}")
    if jdbc_jar() is None:
        raise HistoryUnavailable(
            "the PostgreSQL JDBC driver is missing: apt-get install libpostgresql-jdbc-java "
            "(or point JOBQ_JDBC_JAR at a postgresql.jar)"
        )
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or "5432"
    options: dict[str, str] = {
        "url": f"jdbc:postgresql://{host}:{port}/{db['NAME']}",
        "driver": "org.postgresql.Driver",
        "user": str(db.get("USER") or ""),
        "fetchsize": "10000",
    }
    if db.get("PASSWORD"):
        options["password"] = str(db["PASSWORD"])
    return options


def _history_query(since: dt.datetime | None) -> str:
    event, job = JobEvent._meta.db_table, Job._meta.db_table
    where = ""
    if since is not None:
        # A formatted aware datetime (not user text): nothing to inject.
        where = f"WHERE e.at >= '{since.astimezone(dt.UTC).isoformat()}'::timestamptz"
    error = (
        f"CASE WHEN e.kind = 'failed' THEN COALESCE(j.error->>'type', 'Unknown') END AS error_type,"
        f" CASE WHEN e.kind = 'failed' THEN LEFT(j.error->>'message', {MESSAGE_CHARS}) END"
        " AS error_message"
    )
    # Table names come from the models and ``since`` is a formatted datetime: no outside text.
    # split_part: a partition ("orders~0of3") reads as its logical queue; "~" appears in no
    # other queue name (sharding.py).
    columns = (
        "e.id AS event_id, split_part(e.queue, '~', 1) AS queue, e.job_id AS job_pk, j.job_id,"
        " j.handler, e.kind, e.at"
    )
    source = f"{event} e JOIN {job} j ON j.id = e.job_id {where}"
    return f"SELECT {columns}, e.worker, {error} FROM {source}"  # noqa: S608


def read_jdbc(
    spark: SparkSession,
    *,
    using: str = "default",
    since: dt.datetime | None = None,
    partitions: int = 4,
) -> DataFrame:
    """Events straight from PostgreSQL, read by ``partitions`` parallel range queries on the
    event primary key (each executor streams its own id range)."""
    options = jdbc_options(using)
    bounds = JobEvent.objects.using(using).aggregate(lo=Min("id"), hi=Max("id"))
    reader = spark.read.format("jdbc").options(**options)
    reader = reader.option("dbtable", f"({_history_query(since)}) AS history")
    if bounds["lo"] is not None and partitions > 1:
        reader = (
            reader.option("partitionColumn", "event_id")
            .option("lowerBound", str(bounds["lo"]))
            .option("upperBound", str(bounds["hi"] + 1))
            .option("numPartitions", str(partitions))
        )
    return reader.load().select(*EVENT_COLUMNS)
