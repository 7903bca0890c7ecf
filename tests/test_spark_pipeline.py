"""The Spark pipeline end to end on a generated history with known answers: export to Parquet,
analytics from Parquet and over JDBC against figures computed in plain Python, and the
management commands. Real PostgreSQL, a real local SparkSession."""

from __future__ import annotations

import datetime as dt

import pyarrow.dataset as ds
import pytest
from django.core.management import call_command

from django_jobq.contrib.spark import export_history, run_analytics
from django_jobq.contrib.spark.metrics import ACCURACY
from django_jobq.models import ExportWatermark, QueueMetric

from . import spark_history as history

pytestmark = [
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.django_db(databases=["pg"], transaction=True),
]
DB = "pg"


@pytest.fixture
def jobs():
    generated = history.generate(n_jobs=300)
    history.store(generated, DB)
    return generated


def exported_events(root) -> int:
    return ds.dataset(root / "events", format="parquet", partitioning="hive").count_rows()


def assert_metrics_match(jobs) -> None:
    expected = history.reference_metrics(jobs)
    rows = {
        (m.queue, m.handler, m.period, int(m.bucket.timestamp() * 1000)): m
        for m in QueueMetric.objects.using(DB).all()
    }
    assert set(rows) == set(expected)
    for key, want in expected.items():
        got = rows[key]
        for name in ("started", "completed", "failed", "retried", "stalled", "busy_ms", "workers"):
            assert getattr(got, name) == want[name], (key, name)
        for name in ("throughput", "retry_rate", "stall_rate", "utilisation"):
            assert getattr(got, name) == pytest.approx(want[name]), (key, name)
        assert got.failure_classes == want["failure_classes"], key
        for p, suffix in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            assert history.percentile_ok(getattr(got, f"wait_{suffix}"), want["wait"], p, ACCURACY)
            assert history.percentile_ok(getattr(got, f"run_{suffix}"), want["run"], p, ACCURACY)


def test_export_writes_every_event_once_partitioned_by_queue_and_date(jobs, tmp_path):
    result = export_history(tmp_path, using=DB, settle=0, chunk=250)

    total = sum(len(j.events) for j in jobs)
    assert (result.events, result.jobs) == (total, len(jobs))
    assert exported_events(tmp_path) == total
    partitions = {p.parent.name + "/" + p.name for p in (tmp_path / "events").glob("*/*")}
    assert partitions == {
        f"queue={q}/date={d}" for q in history.HANDLERS for d in ("2026-03-01", "2026-03-02")
    }


def test_export_rerun_writes_only_new_history(jobs, tmp_path):
    export_history(tmp_path, using=DB, settle=0, chunk=250)

    again = export_history(tmp_path, using=DB, settle=0)
    later = history.generate(n_jobs=20, seed=99, start=history.START + dt.timedelta(days=1))
    for job in later:
        job.job_id = "later-" + job.job_id
    history.store(later, DB)
    third = export_history(tmp_path, using=DB, settle=0)

    assert (again.events, again.jobs) == (0, 0)
    assert third.events == sum(len(j.events) for j in later)
    assert third.jobs == len(later)  # every generated job finished
    assert exported_events(tmp_path) == sum(len(j.events) for j in jobs + later)
    mark = ExportWatermark.objects.using(DB).get(target=str(tmp_path.resolve()))
    assert mark.rows_written == exported_events(tmp_path)


def test_export_leaves_unsettled_events_for_the_next_run(jobs, tmp_path):
    result = export_history(tmp_path, using=DB, settle=10 * 365 * 86_400)

    assert result.events == 0


def test_analytics_from_parquet_match_plain_python_and_rerun_changes_nothing(jobs, tmp_path, spark):
    export_history(tmp_path, using=DB, settle=0)

    first = run_analytics(spark, input_dir=str(tmp_path), using=DB)
    assert_metrics_match(jobs)
    before = list(QueueMetric.objects.using(DB).order_by("pk").values_list("pk", "completed"))
    second = run_analytics(spark, input_dir=str(tmp_path), using=DB)

    assert first.events == second.events == sum(len(j.events) for j in jobs)
    after = list(QueueMetric.objects.using(DB).order_by("pk").values_list("pk", "completed"))
    assert after == before
    assert_metrics_match(jobs)


def test_analytics_over_jdbc_match_plain_python(jobs, spark):
    result = run_analytics(spark, jdbc=True, using=DB)

    assert result.events == sum(len(j.events) for j in jobs)
    assert_metrics_match(jobs)


def test_analytics_since_reads_whole_days_only(jobs, spark):
    since = dt.datetime(2026, 3, 2, 0, 30, tzinfo=dt.UTC)  # widened to midnight

    result = run_analytics(spark, jdbc=True, using=DB, since=since)

    assert result.since == dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    midnight_ms = int(result.since.timestamp() * 1000)
    assert result.events == sum(1 for j in jobs for e in j.events if e[1] >= midnight_ms)
    days = set(QueueMetric.objects.using(DB).filter(period="day").values_list("bucket", flat=True))
    assert days == {result.since}


def test_commands_export_then_analyse(jobs, tmp_path, spark, capsys):
    call_command("jobq_export", "--to", str(tmp_path), "--database", DB, "--settle", "0")
    call_command("jobq_analytics", "--input", str(tmp_path), "--database", DB)

    out = capsys.readouterr().out
    assert f"exported {sum(len(j.events) for j in jobs)} events" in out
    assert "metric rows" in out
    assert_metrics_match(jobs)


def test_commands_refuse_bad_options(tmp_path, spark):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="ISO date"):
        call_command("jobq_export", "--to", str(tmp_path), "--since", "yesterday")
    with pytest.raises(CommandError, match="jobq_export --to"):
        call_command("jobq_analytics", "--input", str(tmp_path / "nothing"), "--database", DB)
    with pytest.raises(CommandError, match="reads PostgreSQL"):
        call_command("jobq_analytics", "--jdbc", "--database", "default")


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_export_reads_sqlite_too_in_bounded_id_batches(tmp_path, monkeypatch):
    from django_jobq.contrib.spark import export as export_module

    monkeypatch.setattr(export_module, "IN_BATCH", 7)  # several IN (...) batches per chunk
    generated = history.generate(n_jobs=60, seed=3)
    history.store(generated, "default")

    result = export_history(tmp_path, using="default", settle=0, chunk=100)

    assert (result.events, result.jobs) == (sum(len(j.events) for j in generated), 60)
    jobs = ds.dataset(tmp_path / "jobs", format="parquet", partitioning="hive").to_table()
    assert sorted(jobs.column("job_id").to_pylist()) == sorted(j.job_id for j in generated)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01", dt.datetime(2026, 3, 1, tzinfo=dt.UTC)),
        ("2026-03-01T12:30+02:00", dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC)),
        ("90m", dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC)),
        ("6h", dt.datetime(2026, 3, 1, 6, tzinfo=dt.UTC)),
        ("7d", dt.datetime(2026, 2, 22, 12, tzinfo=dt.UTC)),
    ],
)
def test_since_accepts_dates_datetimes_and_ages(text, expected):
    from django_jobq.contrib.spark.cli import parse_since

    assert parse_since(text, now=dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)) == expected
