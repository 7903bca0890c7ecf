"""Building the SparkSession: embedded ``local[*]`` by default, a cluster by ``--master``.

Why these defaults: the analytics shuffle a few million rows at most per run, so Spark's 200
shuffle partitions would mostly schedule empty tasks; the UI would open a port nobody reads; and
every timestamp is UTC so that buckets do not move with the machine's time zone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# Debian's libpostgresql-jdbc-java: Spark cannot fetch the driver from Maven at run time here.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"


def resolve_master(master: str | None = None) -> str:
    """``master``, else ``$SPARK_MASTER``, else embedded ``local[*]``."""
    return master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver jar (``$JOBQ_JDBC_JAR`` or Debian's), if it exists."""
    path = os.environ.get("JOBQ_JDBC_JAR", DEFAULT_JDBC_JAR)
    return path if Path(path).is_file() else None


def get_spark(
    master: str | None = None,
    *,
    app_name: str = "django-jobq",
    shuffle_partitions: int = 8,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the SparkSession (an existing one is reused: Spark allows one per process).

    Starting one costs seconds and about a GiB of memory: call this from management commands
    and batch jobs, never inside a web request.

    Args:
        master: ``local[*]``, ``local[2]``, ``spark://host:7077``…; default ``$SPARK_MASTER``
            or ``local[*]``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``.
        conf: extra Spark settings, applied last.
    """
    master = resolve_master(master)
    if master.startswith("local"):
        # An embedded session talks to itself only: never bind the machine's public address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors must run the project's interpreter (Django, django_jobq and the settings module
    # are installed there); spark-submit reads the same variable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
    )
    if settings_module:
        builder = builder.config("spark.executorEnv.DJANGO_SETTINGS_MODULE", settings_module)
    jar = jdbc_jar()
    if jar:
        builder = builder.config("spark.jars", jar)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
