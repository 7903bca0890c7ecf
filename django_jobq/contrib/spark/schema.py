"""The shape of the history every analytics source produces, and of the Parquet export.

One flat event row carries what the metrics need from its job too (handler, error), so the
analytics never join millions of events to jobs: the export and the JDBC query do that join
once, where the database can use its indexes.
"""

from __future__ import annotations

from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Kinds a job enters the runnable state with; the wait time runs from one of them to a claim.
RUNNABLE_KINDS = ("queued", "released", "stalled")
# Attempt outcomes whose duration is a handler run time (the percentiles).
RUN_OUTCOMES = ("completed", "failed", "retrying")
# Attempt outcomes that kept a worker busy (utilisation): the runs, plus a handler that gave
# the job back (released on shutdown, postponed because rate limited). A stall is not counted:
# its worker was gone, and the lease length says nothing about work done.
BUSY_OUTCOMES = (*RUN_OUTCOMES, "released", "postponed")
MESSAGE_CHARS = 500  # error messages are grouped on this prefix

EVENT_COLUMNS = (
    "event_id", "queue", "job_pk", "job_id", "handler", "kind", "at", "worker", "error_type",
    "error_message",
)  # fmt: skip

EVENT_SCHEMA = StructType(
    [
        StructField("event_id", LongType(), False),
        StructField("job_pk", LongType(), False),
        StructField("job_id", StringType(), False),
        StructField("handler", StringType(), True),
        StructField("kind", StringType(), False),
        StructField("at", TimestampType(), False),
        StructField("worker", StringType(), True),
        StructField("error_type", StringType(), True),
        StructField("error_message", StringType(), True),
        # partition columns of the export (directories queue=…/date=…)
        StructField("queue", StringType(), False),
        StructField("date", StringType(), False),
    ]
)
