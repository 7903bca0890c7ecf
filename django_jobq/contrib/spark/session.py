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

from pyspark import SparkConf
from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# Debian's libpostgresql-jdbc-java: Spark cannot fetch the driver from Maven at run time here.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver jar (``$JOBQ_JDBC_JAR`` or Debian's), if it exists."""
    path = os.environ.get("JOBQ_JDBC_JAR", DEFAULT_JDBC_JAR)
    return path if Path(path).is_file() else None


def _defaults(shuffle_partitions: int) -> dict[str, str]:
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
    }
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE")
    if settings_module:
        defaults["spark.executorEnv.DJANGO_SETTINGS_MODULE"] = settings_module
    jar = jdbc_jar()
    if jar:
        defaults["spark.jars"] = jar
    return defaults


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

    Under ``spark-submit`` (the driver then talks to the JVM spark-submit started), what its
    command line and ``spark-defaults.conf`` set wins over the defaults here, master included.

    Args:
        master: ``local[*]``, ``local[2]``, ``spark://host:7077``…; default ``$SPARK_MASTER``
            or ``local[*]``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``.
        conf: extra Spark settings, applied last.
    """
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    master = master or os.environ.get("SPARK_MASTER") or (None if submitted else DEFAULT_MASTER)
    if master is not None and master.startswith("local"):
        # An embedded session talks to itself only: never bind the machine's public address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors must run the project's interpreter (Django, django_jobq and the settings module
    # are installed there); spark-submit reads the same variable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    given = SparkConf() if submitted else None  # reads what spark-submit was given
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in _defaults(shuffle_partitions).items():
        if given is None or not given.contains(key):
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
