"""enqueue_dataframe: bulk enqueue from Spark executors into real Redis, deduplicated by id,
safe to rerun, and refusing bad input before anything is sent."""

from __future__ import annotations

import functools

import pytest
from django.conf import settings
from pyspark.sql import types as T

from django_jobq.contrib.spark import EnqueueCounts, enqueue_dataframe
from django_jobq.errors import InvalidOption, InvalidPayload
from django_jobq.states import JobState

from .spark_queues import redis_queue

pytestmark = [pytest.mark.spark, pytest.mark.redis]
QUEUE = "spark-bulk"
SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.StringType()),
        T.StructField("amount", T.LongType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("customer", T.StructType([T.StructField("name", T.StringType())])),
    ]
)


@pytest.fixture
def make_queue(redis_prefix):
    return functools.partial(redis_queue, settings.REDIS_URL, redis_prefix)


def rows_with_duplicates():
    unique = [(f"order-{i}", i * 10, ["a", str(i)], (f"c{i}",)) for i in range(200)]
    repeats = [(f"order-{i}", -1, ["repeat"], None) for i in range(50)]  # same ids, other data
    return unique + repeats


def test_enqueue_dataframe_stores_each_id_once_and_counts_outcomes(spark, make_queue):
    queue = make_queue(QUEUE)
    queue.enqueue_many([(f"order-{i}", {"before": True}) for i in range(20)])
    df = spark.createDataFrame(rows_with_duplicates(), SCHEMA).repartition(4)

    counts = enqueue_dataframe(
        df, QUEUE, "order_id", ["amount", "tags", "customer"], options={"priority": 3},
        make_queue=make_queue, batch=16,
    )  # fmt: skip

    assert counts == EnqueueCounts(queued=180, duplicate=70)
    assert queue.counts()[JobState.QUEUED] == 200
    for i in (20, 77, 199):  # never duplicated: the row's payload, the options given
        record = queue.storage.get_record(QUEUE, f"order-{i}")
        assert queue.serde_loads(record.payload) == {
            "amount": i * 10,
            "tags": ["a", str(i)],
            "customer": {"name": f"c{i}"},
        }
        assert queue.get_status(f"order-{i}").priority == 3
    assert queue.serde_loads(queue.storage.get_record(QUEUE, "order-5").payload) == {"before": True}


def test_enqueue_dataframe_rerun_after_a_partial_run_sends_only_what_is_missing(spark, make_queue):
    df = spark.createDataFrame(rows_with_duplicates(), SCHEMA).repartition(4)
    # A first run that died after one partition: only part of the rows went out.
    first_part = df.where("amount >= 0 AND amount < 500")
    partial = enqueue_dataframe(first_part, QUEUE, "order_id", make_queue=make_queue)

    rerun = enqueue_dataframe(df, QUEUE, "order_id", make_queue=make_queue)

    assert partial == EnqueueCounts(queued=50)
    assert rerun == EnqueueCounts(queued=150, duplicate=100)
    assert make_queue(QUEUE).counts()[JobState.QUEUED] == 200


def test_enqueue_dataframe_refuses_invalid_ids_before_sending_anything(spark, make_queue):
    rows = [("order-1", 1, [], None), ("bad id with spaces", 2, [], None), ("order-3", 3, [], None)]
    df = spark.createDataFrame(rows, SCHEMA)

    with pytest.raises(InvalidOption, match="bad id with spaces"):
        enqueue_dataframe(df, QUEUE, "order_id", make_queue=make_queue)

    assert sum(make_queue(QUEUE).counts().values()) == 0


def test_enqueue_dataframe_refuses_columns_without_json_form(spark, make_queue):
    df = spark.sql("SELECT 'order-1' AS order_id, current_timestamp() AS at")

    with pytest.raises(InvalidOption, match="cast them"):
        enqueue_dataframe(df, QUEUE, "order_id", make_queue=make_queue)
    with pytest.raises(InvalidOption, match="no such column"):
        enqueue_dataframe(df, QUEUE, "order_id", ["missing"], make_queue=make_queue)
    with pytest.raises(InvalidOption, match="unknown job option"):
        enqueue_dataframe(df, QUEUE, "order_id", [], options={"colour": 1}, make_queue=make_queue)


def test_enqueue_dataframe_refuses_a_nan_row_before_sending_anything(spark, make_queue):
    """Issue 36: a NaN cell raised InvalidPayload inside foreachPartition after the batches
    before it were stored; now every row is built (validated) before the first is sent."""
    schema = T.StructType([T.StructField("order_id", T.StringType()),
                           T.StructField("score", T.DoubleType()),
                           T.StructField("nested", T.ArrayType(T.DoubleType()))])  # fmt: skip
    rows = [(f"order-{i}", float(i), [1.0]) for i in range(40)]
    rows[33] = ("order-33", 1.0, [float("inf")])
    rows[37] = ("order-37", float("nan"), [])
    df = spark.createDataFrame(rows, schema).coalesce(1)  # one partition: the order is kept

    with pytest.raises(InvalidPayload, match="order-33") as refused:
        enqueue_dataframe(df, QUEUE, "order_id", make_queue=make_queue, batch=2)

    assert "order-37" in str(refused.value) and "nothing enqueued" in str(refused.value)
    assert sum(make_queue(QUEUE).counts().values()) == 0
