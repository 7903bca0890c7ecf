"""Scale-out, tested: the same analytics on a standalone Spark master and worker (started from
the pip-installed PySpark on loopback) give the same figures as plain Python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connections

from django_jobq.contrib.spark import export_history, submit

from . import spark_history as history
from .helpers import ROOT
from .spark_cluster import SPARK_HOME, Cluster
from .test_spark_pipeline import DB, assert_metrics_match

pytestmark = [
    pytest.mark.spark,
    pytest.mark.spark_cluster,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["pg"], transaction=True),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        running.start()
        yield running
    finally:
        running.stop()
        assert running.alive() == [], "cluster processes left behind"


def env() -> dict[str, str]:
    """The subprocesses' environment. They must read the test database pytest-django made (its
    name is only known now), not the settings' default name, which does not exist in CI."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
    }


@pytest.fixture
def jobs(tmp_path):
    generated = history.generate(n_jobs=300)
    history.store(generated, DB)
    export_history(tmp_path / "export", using=DB, settle=0)
    return generated


def test_analytics_on_a_standalone_cluster_match_plain_python(cluster, jobs, tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "jobq_analytics", "--master", cluster.url,
         "--input", str(tmp_path / "export"), "--database", DB, "--settings", "tests.settings"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-5000:]
    assert f"on {cluster.url}" in done.stdout
    assert "Registering app jobq-analytics" in cluster.log("master")
    assert_metrics_match(jobs)


def test_spark_submit_runs_the_analytics_on_the_cluster_it_was_given(cluster, jobs, tmp_path):
    done = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url,
         "--conf", "spark.sql.shuffle.partitions=3", submit.__file__,
         "--input", str(tmp_path / "export"), "--database", DB],
        cwd=ROOT, env={**env(), "SPARK_HOME": str(SPARK_HOME)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-5000:]
    assert f"on {cluster.url}" in done.stdout
    assert_metrics_match(jobs)
