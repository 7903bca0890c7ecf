"""The per-minute rollup behind the admin's charts and last-hour counts (django_jobq/rollup.py),
on SQLite and PostgreSQL: whatever the order in which rows arrive, folds happen and budgets
cut them, the folded minutes equal a GROUP BY over the job rows."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator

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


def run_plan(alias: str, plan: list) -> Iterator[tuple[dt.datetime, rollup.FoldResult | None]]:
    """Apply ``steps`` from an empty table, yielding the clock and the fold's result (None for
    other steps) after each. Jobs start when due and finish ``step[1]`` s before now."""
    for model in (Job, JobMinute, RollupMark):
        model.objects.using(alias).all().delete()
    now = T0
    for n, step in enumerate(plan):
        result = None
        if step[0] == "tick":
            now += dt.timedelta(seconds=step[1])
        elif step[0] in ("finish", "late"):
            finished = now - dt.timedelta(seconds=step[1])
            state = JobState.COMPLETED if step[2] else JobState.FAILED
            started = finished - dt.timedelta(milliseconds=40 * n)
            created = started - dt.timedelta(seconds=1 + n % 7)
            Job.objects.using(alias).create(
                queue=step[3], job_id=f"j{n}", state=state, created_at=created,
                started_at=started, finished_at=finished,
                run_at=created + dt.timedelta(seconds=1) if n % 3 == 0 else None,
            )  # fmt: skip
            if step[0] == "late":
                rollup.reopen(alias, [finished])
        else:
            result = rollup.fold(alias, now, budget=step[1])
        yield now, result


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
    steps_run = list(run_plan(alias, plan))
    now = steps_run[-1][0] if steps_run else T0
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


def test_rows_sharing_one_instant_beyond_the_budget_are_folded_together():
    for i in range(7):
        Job.objects.create(queue="a", job_id=f"j{i}", state=JobState.FAILED, created_at=T0,
                           finished_at=T0 - dt.timedelta(minutes=10))  # fmt: skip
    for _ in range(25 * 60):
        if not rollup.fold("default", T0, budget=2).behind:
            break
        assert JobMinute.objects.filter(failed__gt=0, failed__lt=7).count() == 0
    assert JobMinute.objects.get().failed == 7


def test_a_budget_ends_inside_a_minute_and_the_next_fold_adds_the_rest():
    """A burst in one minute: each fold reads about ``budget`` rows, not the whole minute
    (150,000 rows in one view took seconds), and the minute row ends up exact."""
    burst = T0 - dt.timedelta(minutes=10)
    Job.objects.bulk_create(
        Job(queue="a", job_id=f"j{i}", created_at=burst, started_at=burst,
            finished_at=burst + dt.timedelta(milliseconds=i),
            state=JobState.FAILED if i % 4 == 0 else JobState.COMPLETED)
        for i in range(500)
    )  # fmt: skip
    rollup.fold("default", T0)  # nothing before the burst: the mark moves up to it
    RollupMark.objects.update(until=rollup.floor_minute(burst))
    reads = []
    while (result := rollup.fold("default", T0, budget=40)).behind:
        reads.append(result.rows)
    assert max(reads) <= 41 and len(reads) >= 500 // 41
    [row] = JobMinute.objects.filter(minute=rollup.floor_minute(burst))
    assert (row.completed, row.failed) == (375, 125)
    assert sum(row.runs.values()) == 500 and row.run_ms_total == pytest.approx(sum(range(500)))


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


def direct(alias: str, since: dt.datetime) -> dict[str, tuple[int, int, int, float, float]]:
    """What ``finished_since`` must say, from the job rows alone."""
    out: dict[str, list] = {}
    rows = Job.objects.using(alias).filter(
        finished_at__gte=rollup.floor_minute(since), state__in=rollup.FINISHED
    )
    for queue, state, created, run_at, started, finished in rows.values_list(
        "queue", "state", "created_at", "run_at", "started_at", "finished_at"
    ):
        slot = out.setdefault(queue, [0, 0, 0, 0.0, 0.0])
        slot[0 if state == JobState.COMPLETED.value else 1] += 1
        if started is not None:
            due = run_at if run_at and run_at > created else created
            slot[2] += 1
            slot[3] += (started - due).total_seconds() * 1000
            slot[4] += (finished - started).total_seconds() * 1000
    return {q: tuple(v) for q, v in out.items()}


def said(alias: str, since: dt.datetime, until: dt.datetime | None = None) -> dict:
    return {
        q: (f.completed, f.failed, f.timed, pytest.approx(f.wait_ms), pytest.approx(f.run_ms))
        for q, f in rollup.finished_since(alias, since, until).items()
        if f.ended
    }


@pytest.mark.parametrize("alias", ["default", "pg"])
@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
           HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(steps, max_size=30))
def test_last_hour_counts_are_exact_at_every_step_of_a_fold_catching_up(alias, plan):
    """The overview's and the API's last-hour figures: whatever the fold has reached (a
    budget cut, a late row reopening minutes, no fold at all yet), the minute rows before
    the mark plus the job rows after it equal the job rows of the hour."""
    for now, result in run_plan(alias, plan):
        hour_ago = now - dt.timedelta(hours=1)
        if result is not None:
            assert said(alias, hour_ago, result.until) == direct(alias, hour_ago)
        assert said(alias, hour_ago) == direct(alias, hour_ago)


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_the_overview_counts_a_burst_exactly_and_says_the_charts_catch_up(
    admin_client, settings, monkeypatch
):
    """Issue 37, defect 4: after a burst larger than a fold's budget the overview showed the
    folded part only ("22,858 instead of 150,000") and did not say it was catching up."""
    from django.urls import reverse
    from django.utils import timezone

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    from django_jobq.queue import Queue

    Queue("burst").enqueue("seed", {})  # the queue is known (its one job waits)
    now = timezone.now()
    start = now - dt.timedelta(minutes=40)
    Job.objects.bulk_create(
        Job(queue="burst", job_id=f"b{n}", created_at=start, started_at=start,
            finished_at=start + dt.timedelta(seconds=n // 100),
            state=JobState.FAILED if n % 10 == 0 else JobState.COMPLETED)
        for n in range(3000)
    )  # fmt: skip
    monkeypatch.setattr(rollup, "BUDGET", 500)  # one view folds a sixth of the burst
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    html = page.content.decode()
    assert rollup.fold(alias="default", now=now, budget=1).behind  # still behind after the view
    row = html[html.index('data-queue="burst"') :]
    row = row[: row.index("</tr>")]
    assert "&nbsp;2,700</span> / <span" in row and "&nbsp;300</span>" in row
    assert 'id="jobq-folding"' in html
