"""The per-minute rollup behind the admin's charts and last-hour counts (django_jobq/rollup.py),
on SQLite and PostgreSQL: whatever the order in which rows arrive, folds happen and budgets
cut them, the folded minutes equal a GROUP BY over the job rows."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_jobq.mirror import rollup
from django_jobq.models import Job, JobMinute, RollupMark
from django_jobq.states import JobState

pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)
T0 = dt.datetime(2026, 11, 25, 12, 0, 7, tzinfo=dt.UTC)

# One step: advance the clock, finish a job on time (committed within REOPEN of its finish),
# write one late as the mirror does after an outage (then reopen), or fold with a budget.
steps = st.one_of(
    st.tuples(st.just("tick"), st.integers(0, 400)),
    st.tuples(st.just("finish"), st.integers(0, 60), st.booleans(), st.sampled_from("ab")),
    st.tuples(st.just("late"), st.integers(0, 4 * 3600), st.booleans(), st.sampled_from("ab")),
    st.tuples(st.just("fold"), st.integers(1, 6)),
)


def expected(alias: str, now: dt.datetime) -> Counter:
    oldest = rollup.floor_minute(now - rollup.KEEP)
    out: Counter = Counter()
    rows = Job.objects.using(alias).filter(
        finished_at__gte=oldest, finished_at__lt=rollup.floor_minute(now) + rollup.STEP
    )
    for queue, state, finished in rows.values_list("queue", "state", "finished_at"):
        out[(queue, rollup.floor_minute(finished), state)] += 1
    return out


def folded(alias: str) -> Counter:
    out: Counter = Counter()
    for row in JobMinute.objects.using(alias):
        out[(row.queue, row.minute, JobState.COMPLETED.value)] += row.completed
        out[(row.queue, row.minute, JobState.FAILED.value)] += row.failed
    return +out


@pytest.mark.parametrize("alias", ["default", "pg"])
@hsettings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
           HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(steps, max_size=40))
# Found by this test: a job finished 8 s before a fold and committed after it was never folded
# (the next fold started at the mark, not REOPEN before it).
@example(plan=[("fold", 1), ("finish", 8, False, "a"), ("tick", 53)])
def test_folded_minutes_equal_a_group_by_over_the_rows(alias, plan):
    for model in (Job, JobMinute, RollupMark):
        model.objects.using(alias).all().delete()
    now = T0
    for n, step in enumerate(plan):
        if step[0] == "tick":
            now += dt.timedelta(seconds=step[1])
        elif step[0] in ("finish", "late"):
            finished = now - dt.timedelta(seconds=step[1])
            state = JobState.COMPLETED if step[2] else JobState.FAILED
            Job.objects.using(alias).create(
                queue=step[3], job_id=f"j{n}", state=state, created_at=finished,
                started_at=finished, finished_at=finished,
            )  # fmt: skip
            if step[0] == "late":
                rollup.reopen(alias, [finished])
        else:
            rollup.fold(alias, now, budget=step[1])
    for _ in range(25 * 60 + 1):
        if not rollup.fold(alias, now, budget=3).behind:
            break
    assert folded(alias) == +expected(alias, now)


def test_a_fold_reads_only_the_rows_since_its_mark(django_assert_max_num_queries):
    """The second fold of a page view reads the last REOPEN minutes, not the day: its one
    SELECT of job rows is bounded by finished_at >= the mark minus REOPEN."""
    now = T0
    Job.objects.create(queue="a", job_id="old", state=JobState.COMPLETED, created_at=now,
                       finished_at=now - dt.timedelta(hours=3))  # fmt: skip
    first = rollup.fold("default", now)
    assert not first.behind and first.rows == 1
    again = rollup.fold("default", now + dt.timedelta(seconds=30))
    assert again.rows == 0  # the 3-hour-old row is behind the mark: not read again
    assert folded("default")[("a", rollup.floor_minute(now - dt.timedelta(hours=3)),
                              "completed")] == 1  # fmt: skip


def test_a_budget_too_small_for_one_minute_still_folds_that_minute_whole():
    for i in range(7):
        Job.objects.create(queue="a", job_id=f"j{i}", state=JobState.FAILED, created_at=T0,
                           finished_at=T0 - dt.timedelta(minutes=10))  # fmt: skip
    for _ in range(25 * 60):  # one minute (at least) per fold through the day of backlog
        if not rollup.fold("default", T0, budget=2).behind:
            break
        assert JobMinute.objects.filter(failed__gt=0, failed__lt=7).count() == 0
    assert JobMinute.objects.get().failed == 7


def test_histograms_give_wait_and_run_percentiles():
    for i, run_ms in enumerate((10, 20, 400)):
        started = T0 - dt.timedelta(seconds=50)
        Job.objects.create(
            queue="a", job_id=f"j{i}", state=JobState.COMPLETED,
            created_at=started - dt.timedelta(milliseconds=1000), started_at=started,
            finished_at=started + dt.timedelta(milliseconds=run_ms),
        )  # fmt: skip
    rollup.fold("default", T0)
    [row] = JobMinute.objects.all()
    runs: dict[int, int] = {}
    rollup.merge(runs, row.runs)
    assert abs(rollup.quantile(runs, 0.5) - 20) / 20 < 0.09
    assert abs(rollup.quantile(runs, 1.0) - 400) / 400 < 0.09
    waits: dict[int, int] = {}
    rollup.merge(waits, row.waits)
    assert abs(rollup.quantile(waits, 0.5) - 1000) / 1000 < 0.09
