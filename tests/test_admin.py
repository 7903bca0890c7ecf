"""The admin dashboard through Django's test client, on the embedded database backend (SQLite)
and on Redis with the model mirror: pages render live figures, and every action changes the
storage through the Queue API, with permissions enforced and per-job outcomes reported."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from django_jobq.admin import actions, listing
from django_jobq.admin.charts import WINDOWS, _scale, throughput
from django_jobq.backend import get_storage
from django_jobq.mirror import Mirror, rollup
from django_jobq.models import Job, JobEvent, Schedule, WorkerInfo
from django_jobq.queue import Queue
from django_jobq.schedules.core import fire_now
from django_jobq.states import JobState

Q = "admin-tests"
ON_DEFAULT_DB = pytest.mark.django_db(databases=["default"], transaction=True)
pytestmark = ON_DEFAULT_DB

ERROR = json.dumps({"type": "ValueError", "message": "bad input", "traceback": "Traceback: x"})


class Setup:
    """The configured storage plus a way to bring the rows up to date (the mirror on Redis)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.storage = get_storage()
        self.queue = Queue(Q)

    def sync(self) -> None:
        if self.kind == "redis":
            Mirror(self.storage, queues=[Q], using="default", consumer="admin-tests").drain()

    def row(self, job_id: str) -> Job:
        self.sync()
        return Job.objects.get(queue=Q, job_id=job_id)

    def failed(self, job_id: str) -> None:
        self.queue.enqueue(job_id, {"n": job_id}, max_attempts=1)
        [claimed] = self.storage.claim(Q, "w-1", 1, 30_000).jobs
        self.storage.fail(Q, claimed.job_id, claimed.token, ERROR.encode(), permanent=True)

    def completed(self, job_id: str) -> None:
        self.queue.enqueue(job_id, {"n": job_id})
        [claimed] = self.storage.claim(Q, "w-1", 1, 30_000).jobs
        self.storage.complete(Q, claimed.job_id, claimed.token, b'{"ok": true}')

    def state(self, job_id: str) -> JobState:
        status = self.queue.get_status(job_id)
        assert status is not None
        return status.state


def on_redis(settings, prefix: str) -> Setup:
    settings.JOBQ = {
        **settings.JOBQ, "BACKEND": "redis", "PREFIX": prefix,
        "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": "default"},
    }  # fmt: skip
    return Setup("redis")


@pytest.fixture(params=["database", pytest.param("redis", marks=pytest.mark.redis)])
def jobq(request, settings) -> Setup:
    if request.param == "redis":
        return on_redis(settings, request.getfixturevalue("redis_prefix"))
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    return Setup("database")


def staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def job_url(setup: Setup, job_id: str, *, act: str | None = None) -> str:
    pk = setup.row(job_id).pk
    if act:
        return reverse("admin:django_jobq_job_act", args=[pk, act])
    return reverse("admin:django_jobq_job_change", args=[pk])


CHANGELIST = "admin:django_jobq_job_changelist"
CHANGE = "admin:django_jobq_job_change"


# -- overview, queue page, workers -----------------------------------------------------------


def test_overview_shows_live_counts_and_pause_resume_goes_through_the_queue(admin_client, jobq):
    jobq.queue.enqueue("a", 1)
    jobq.queue.enqueue("b", 2, delay=60_000)
    jobq.completed("c")
    jobq.sync()
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    assert page.status_code == 200
    row = next(r for r in page.context["rows"] if r["name"] == Q)
    assert row["counts"]["queued"] == 1 and row["counts"]["scheduled"] == 1
    assert row["completed_hour"] == 1 and row["failure_rate"] == 0.0
    assert row["paused"] is False and row["oldest_age"] is not None

    pause = reverse("admin:django_jobq_queue_pause", args=[Q, "pause"])
    assert admin_client.post(pause).status_code == 302
    assert jobq.queue.is_paused()
    admin_client.post(reverse("admin:django_jobq_queue_pause", args=[Q, "resume"]))
    assert not jobq.queue.is_paused()


def test_overview_counts_failure_handler_calls_not_done_yet(admin_client, jobq):
    jobq.storage.set_failure_hook(Q, True)
    jobq.failed("f1")
    jobq.failed("f2")
    jobq.sync()
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    row = next(r for r in page.context["rows"] if r["name"] == Q)
    assert (row["dead"], row["failure_calls"]) == (2, 2)
    assert b"(2&nbsp;pending)" in page.content


def test_auto_refresh_takes_only_the_offered_periods(admin_client, jobq):
    url = reverse("admin:django_jobq_queueconfig_changelist")
    page = admin_client.get(url, {"refresh": "10"}).content
    assert b'data-jobq-every="10"' in page and b'http-equiv="refresh"' not in page  # in place
    for bad in ("1", "0", "-5", "abc"):
        assert b'data-jobq-every="5"' in admin_client.get(url, {"refresh": bad}).content


def test_overview_and_workers_answer_their_poll_with_the_rows_alone(admin_client, jobq):
    jobq.queue.enqueue_many([(f"p{i}", i) for i in range(3)])
    overview = reverse("admin:django_jobq_queueconfig_changelist")
    polled = admin_client.get(overview, {"live": "1"})
    assert polled["Content-Type"] == "application/json"
    rows = polled.json()["html"]["jobq-queues-body"]
    assert f'<tr data-queue="{Q}">' in rows and "<html" not in rows
    unmasked = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')  # masked anew per render
    page = unmasked.sub("", admin_client.get(overview).content.decode())
    assert unmasked.sub("", rows).strip() in page  # the page's own rows, Pause back to the page
    jobq.storage.register_worker("w-poll", {"host": "h", "pid": 1, "queues": [Q]}, 60_000)
    workers = admin_client.get(reverse("admin:django_jobq_workerinfo_changelist"), {"live": "1"})
    assert "w-poll" in workers.json()["html"]["jobq-workers-body"]


def test_queue_page_polls_its_row_and_charts_in_place_instead_of_reloading(admin_client, jobq):
    jobq.queue.enqueue_many([(f"p{i}", i) for i in range(3)])
    url = reverse("admin:django_jobq_queue_detail", args=[Q])
    page = admin_client.get(url, {"refresh": "30"}).content.decode()
    assert 'http-equiv="refresh"' not in page and 'data-jobq-every="30"' in page
    assert 'id="jobq-updated"' in page and "jobq-live.js" in page
    jobq.failed("f1")
    polled = admin_client.get(url, {"live": "1"})
    assert polled["Content-Type"] == "application/json" and "no-store" in polled["Cache-Control"]
    html = polled.json()["html"]
    cells = re.findall(r'<td class="num">(\d+)</td>', html["jobq-queue-body"])
    assert cells[:1] == ["3"] and "<html" not in html["jobq-queue-body"]
    assert 'id="jobq-retry-dead"' in html["jobq-queue-live"]  # the new dead letter's button
    assert html["jobq-queue-live"].count("jobq-chart") >= 4  # the hour and the day, redrawn
    assert "Last 30 days" not in html["jobq-queue-live"]  # drawn once, with the page


def test_database_counts_are_exact_past_the_old_cap_and_equal_the_apis(admin_client, settings):
    """On the database backend the overview reads the triggers' counts (``StateCount``): exact
    past 10,000 (where the capped count said "10000+"), cancelled and dead ones included, and
    the same numbers as ``Queue.counts()``, which the API's ``counts`` are."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    queue = Queue(Q)
    queue.enqueue_many([(f"c{i}", i) for i in range(10_050)])
    queue.enqueue("later", 1, delay=60_000)
    assert queue.cancel("c0") is not None and queue.cancel("c1") is not None
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    row = next(r for r in page.context["rows"] if r["name"] == Q)
    api = {state.value: n for state, n in queue.counts().items()}
    assert row["counts"] == {state: api[state] for state in row["counts"]}
    assert (row["counts"]["queued"], row["counts"]["scheduled"]) == (10_048, 1)
    assert row["counts"]["cancelled"] == 2
    assert '<td class="num">10,048</td>' in page.content.decode()
    assert row["oldest_age"] is not None


def test_pause_needs_post_and_the_change_permission(client, jobq):
    jobq.queue.enqueue("a", 1)
    client.force_login(staff("viewer", "view_queueconfig"))
    pause = reverse("admin:django_jobq_queue_pause", args=[Q, "pause"])
    assert client.get(pause).status_code == 405
    assert client.post(pause).status_code == 403
    assert not jobq.queue.is_paused()
    page = client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    assert page.status_code == 200 and b"jobq-pause-" not in page.content


def test_queue_page_draws_throughput_and_latency_charts(admin_client, jobq):
    jobq.completed("c1")
    jobq.failed("f1")
    jobq.sync()
    page = admin_client.get(reverse("admin:django_jobq_queue_detail", args=[Q]))
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('class="jobq-chart"') == 4
    assert 'class="bar ok"' in html and 'class="bar bad"' in html
    unknown = admin_client.get(reverse("admin:django_jobq_queue_detail", args=["nope"]))
    assert unknown.status_code == 404


def test_queue_page_shows_the_spark_daily_history_when_there_is_one(admin_client, jobq):
    from django_jobq.admin.common import jobs_alias
    from django_jobq.models import QueueMetric

    url = reverse("admin:django_jobq_queue_detail", args=[Q])
    jobq.queue.enqueue("a", 1)
    assert b"No daily history yet" in admin_client.get(url).content
    today = dt.datetime.combine(timezone.now().date(), dt.time(), tzinfo=dt.UTC)
    for days, done in ((0, 2880), (3, 1440)):
        QueueMetric.objects.using(jobs_alias()).create(
            queue=Q, handler="h", period="day", bucket=today - dt.timedelta(days=days),
            completed=done, failed=10, run_p50=250.0, run_p95=900.0, wait_p95=40.0,
            computed_at=timezone.now(),
        )  # fmt: skip
    html = admin_client.get(url).content.decode()
    assert "Throughput by day, last 30 days" in html
    assert "completed: 2/min" in html  # 2,880 jobs in a day
    assert html.count('class="jobq-chart"') == 6


def test_workers_page_lists_live_workers_and_their_current_jobs(admin_client, jobq):
    jobq.queue.enqueue("running", 1)
    jobq.storage.claim(Q, "w-77", 1, 30_000)
    info = {
        "host": "box-1",
        "pid": 4242,
        "queues": [Q],
        "concurrency": 4,
        "in_flight": 1,
        "pool": "process",
        "autoscale": {"min": 2, "max": 8, "reason": "slots busy"},
    }
    jobq.storage.register_worker("w-77", info, 30_000)
    jobq.sync()
    page = admin_client.get(reverse("admin:django_jobq_workerinfo_changelist"))
    [worker] = [w for w in page.context["workers"] if w["worker_id"] == "w-77"]
    assert worker["host"] == "box-1" and worker["pid"] == 4242 and not worker["stale"]
    assert worker["pool"] == "process" and worker["autoscale"] == "autoscale 2–8: slots busy"
    assert [j.job_id for j in worker["jobs"]] == ["running"]


def test_a_worker_silent_for_two_heartbeats_is_stale_and_an_expired_one_gone(
    admin_client, settings
):
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    get_storage().register_worker("w-slow", {"host": "h", "queues": [Q]}, 3_600_000)
    get_storage().register_worker("w-dead", {"host": "h", "queues": [Q]}, 3_600_000)
    long_ago = timezone.now() - dt.timedelta(minutes=10)
    WorkerInfo.objects.filter(worker_id="w-slow").update(last_heartbeat=long_ago)
    WorkerInfo.objects.filter(worker_id="w-dead").update(expires_at=long_ago)
    page = admin_client.get(reverse("admin:django_jobq_workerinfo_changelist"))
    workers = {w["worker_id"]: w for w in page.context["workers"]}
    assert workers["w-slow"]["stale"] and not workers["w-slow"]["gone"]
    assert workers["w-dead"]["gone"]


# -- job list -----------------------------------------------------------------------------


def test_job_list_filters_and_searches(admin_client, jobq):
    jobq.failed("broken")  # claims the only queued job: enqueue the other one after
    jobq.queue.enqueue("first", 1)
    jobq.sync()
    url = reverse(CHANGELIST)

    def ids(**params) -> set[str]:
        page = admin_client.get(url, params)
        assert page.status_code == 200, page.content[:300]
        return {job.job_id for job in page.context["cl"].result_list}

    assert ids() == {"first", "broken"}
    assert ids(queue=Q, state__exact="failed") == {"broken"}
    assert ids(q="first") == {"first"}
    assert ids(worker="w-1") == {"broken"}
    assert ids(created="1h") == {"first", "broken"}
    assert ids(o="3") == {"first", "broken"}  # sorted by state
    Job.objects.create(queue=Q, job_id="h1", handler="app.tasks.send", created_at=timezone.now())
    assert ids(q="app.tasks") == {"h1"}  # no job has that id: handlers starting with it


def test_job_list_count_stops_at_the_cap_and_says_so(admin_client, jobq, monkeypatch):
    monkeypatch.setattr(listing, "COUNT_CAP", 2)
    jobq.queue.enqueue_many([(f"j{i}", i) for i in range(5)])
    jobq.sync()
    page = admin_client.get(reverse(CHANGELIST))
    assert page.context["cl"].result_count == 3  # the cap plus one: "more than 2"
    assert b"The total is an estimate" in page.content
    assert b"more than 2 jobs" in page.content


def test_the_result_count_links_to_all_jobs_only_from_a_narrowed_list(admin_client, jobq):
    jobq.queue.enqueue_many([(f"n{i}", i) for i in range(3)])
    jobq.sync()
    whole = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "3 jobs" in whole and 'id="jobq-show-all"' not in whole and "Show all" not in whole
    for query in ("?q=n1", "?state__exact=queued"):
        narrowed = admin_client.get(reverse(CHANGELIST) + query).content.decode()
        assert '<a href="?" id="jobq-show-all">' in narrowed, query


def test_api_docs_send_a_logged_out_visitor_to_log_in_and_redoc_uses_no_cdn(client):
    for name in ("jobq-docs", "jobq-redoc"):
        response = client.get(reverse(name))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login") + "?next=")
    User.objects.create_superuser("docs", password="pw")
    client.login(username="docs", password="pw")
    html = client.get(reverse("jobq-redoc")).content.decode()
    assert "redoc.standalone.js" in html and "googleapis" not in html and "https://" not in html


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_unfiltered_count_on_postgresql_is_the_planner_estimate(monkeypatch):
    from django.db import connections

    monkeypatch.setattr(listing, "COUNT_CAP", 5)
    now = timezone.now()
    Job.objects.using("pg").bulk_create(
        Job(queue=Q, job_id=f"p{i}", created_at=now) for i in range(40)
    )
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    paginator = listing.EstimatedCountPaginator(Job.objects.using("pg").order_by("-id"), 10)
    assert paginator.count == 40 and paginator.approximate
    filtered = Job.objects.using("pg").filter(job_id="p1").order_by("-id")
    assert listing.EstimatedCountPaginator(filtered, 10).count == 1


# -- job page --------------------------------------------------------------------------------


def test_job_page_shows_payload_error_traceback_and_timeline(admin_client, jobq):
    jobq.failed("broken")
    page = admin_client.get(job_url(jobq, "broken"))
    html = page.content.decode()
    assert page.status_code == 200
    assert json.loads(page.context["payload"]) == {"n": "broken"}  # decoded
    assert "ValueError" in html and "Traceback: x" in html
    kinds = [event["kind"] for event in page.context["events"]]
    assert kinds[0] == "failed" and "active" in kinds
    names = [name for name, _, _ in page.context["actions"]]
    assert names == ["retry", "delete"]  # one way to run a failed job again, not two


def test_an_error_made_without_raising_is_shown_once(admin_client, jobq):
    """A flow parent's ChildFailed is never raised: its "traceback" is its headline again."""
    from django_jobq.errors import ChildFailed
    from django_jobq.worker.execution import error_body

    jobq.queue.enqueue("parent", {"n": 1}, max_attempts=1)
    [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
    body = error_body(ChildFailed("1 of 2 children did not complete; kid failed: boom"))
    jobq.storage.fail(Q, "parent", claimed.token, body, permanent=True)
    html = admin_client.get(job_url(jobq, "parent")).content.decode()
    assert html.count("1 of 2 children did not complete") == 1
    assert 'id="jobq-traceback"' not in html
    jobq.failed("raised")  # a real traceback keeps its box
    assert 'id="jobq-traceback"' in admin_client.get(job_url(jobq, "raised")).content.decode()


# -- actions ---------------------------------------------------------------------------------


def test_cancel_from_the_job_page_asks_then_cancels_through_the_queue(admin_client, jobq):
    jobq.queue.enqueue("waiting", 1)
    url = job_url(jobq, "waiting", act="cancel")
    confirm = admin_client.get(url)
    assert confirm.status_code == 200 and b"are you sure" in confirm.content
    assert jobq.state("waiting") is JobState.QUEUED  # asking changes nothing
    done = admin_client.post(url, {"confirm": "yes"})
    assert done.status_code == 302
    assert jobq.state("waiting") is JobState.CANCELLED
    assert jobq.row("waiting").state == JobState.CANCELLED


def test_bulk_retry_reports_each_job(admin_client, jobq):
    jobq.failed("f1")
    jobq.completed("c1")
    jobq.sync()
    pks = [jobq.row(i).pk for i in ("f1", "c1")]
    form = {"action": "retry_jobs", "_selected_action": pks}
    confirm = admin_client.post(reverse(CHANGELIST), {**form, "index": 0})
    assert b"are you sure" in confirm.content and jobq.state("f1") is JobState.FAILED
    done = admin_client.post(reverse(CHANGELIST), {**form, "confirm": "yes"})
    outcomes = {o.job.job_id: (o.ok, o.text) for o in done.context["outcomes"]}
    assert outcomes == {"f1": (True, "retried"), "c1": (False, "completed")}
    assert jobq.state("f1") is JobState.QUEUED
    status = jobq.queue.get_status("f1")
    assert status is not None and status.attempts == 0


def test_requeue_dead_letters_and_delete_only_finished_records(admin_client, jobq):
    jobq.failed("dead1")
    jobq.failed("dead2")
    jobq.completed("fine")
    jobq.queue.enqueue("waiting", 1)
    jobq.sync()
    admin_client.post(job_url(jobq, "dead1", act="requeue_dead"), {"confirm": "yes"})
    assert jobq.state("dead1") is JobState.QUEUED
    for job_id in ("dead2", "fine"):
        admin_client.post(job_url(jobq, job_id, act="delete"), {"confirm": "yes"})
        assert jobq.queue.get_status(job_id) is None
        assert not Job.objects.filter(queue=Q, job_id=job_id).exists()
    assert jobq.queue.enqueue("fine", 1).outcome.value == "queued"  # the id is free again
    kept = admin_client.post(
        job_url(jobq, "waiting", act="delete"), {"confirm": "yes"}, follow=True
    )
    assert b"kept: it is queued" in kept.content
    assert jobq.state("waiting") is JobState.QUEUED


def test_change_priority_validates_input_and_run_now_promotes(admin_client, jobq):
    jobq.queue.enqueue("later", 1, delay=3_600_000)
    url = job_url(jobq, "later", act="priority")
    refused = admin_client.post(url, {"confirm": "yes", "priority": "soon"})
    assert b"Priority must be a whole number" in refused.content
    admin_client.post(url, {"confirm": "yes", "priority": "7"})
    status = jobq.queue.get_status("later")
    assert status is not None and status.priority == 7
    admin_client.post(job_url(jobq, "later", act="run_now"), {"confirm": "yes"})
    assert jobq.state("later") is JobState.QUEUED


def test_actions_need_their_own_permissions(client, jobq):
    jobq.failed("broken")
    jobq.queue.enqueue("waiting", 1)
    client.force_login(staff("viewer", "view_job"))
    assert client.get(job_url(jobq, "waiting")).status_code == 200
    refused = client.post(job_url(jobq, "waiting", act="cancel"), {"confirm": "yes"})
    assert refused.status_code == 403
    assert jobq.state("waiting") is JobState.QUEUED
    listing_page = client.get(reverse(CHANGELIST))
    assert listing_page.context["action_form"] is None  # no action this user may run

    client.force_login(staff("canceller", "view_job", "cancel_job"))
    assert client.post(job_url(jobq, "broken", act="retry"), {"confirm": "yes"}).status_code == 403
    assert jobq.state("broken") is JobState.FAILED
    client.post(job_url(jobq, "waiting", act="cancel"), {"confirm": "yes"})
    assert jobq.state("waiting") is JobState.CANCELLED


def test_stock_delete_is_routed_through_the_queue_api(admin_client, jobq):
    jobq.completed("fine")
    row = jobq.row("fine")
    page = admin_client.get(reverse("admin:django_jobq_job_delete", args=[row.pk]))
    assert page.status_code == 302 and page["Location"].endswith("/act/delete/")
    actions = admin_client.get(reverse(CHANGELIST)).context["action_form"].fields["action"]
    assert "delete_selected" not in dict(actions.choices)


def test_anonymous_users_are_sent_to_the_login_page(client, jobq):
    for name in ("queueconfig_changelist", "workerinfo_changelist", "job_changelist"):
        page = client.get(reverse(f"admin:django_jobq_{name}"))
        assert page.status_code == 302 and "/login/" in page["Location"]


# -- chart arithmetic --------------------------------------------------------------------------


def test_histogram_quantile_is_nearest_rank_within_nine_percent():
    assert rollup.quantile({}, 0.5) is None
    values = [float(i) for i in range(1, 1001)]
    histogram: dict[int, int] = {}
    for value in values:
        histogram[rollup.bucket_of(value)] = histogram.get(rollup.bucket_of(value), 0) + 1
    for q in (0.5, 0.95, 0.99):
        exact = values[int(q * len(values)) - 1]
        assert abs(rollup.quantile(histogram, q) - exact) / exact < 0.09
    assert rollup.quantile({rollup.bucket_of(0.2): 3}, 0.5) == 0.5


def test_axis_bounds_are_round_numbers():
    assert _scale(0)[0] == 1.0
    assert _scale(7.3)[0] == 10
    assert _scale(0.42)[0] == 0.5
    assert _scale(1300)[0] == 2000


def test_throughput_buckets_by_finish_minute(settings):
    now = timezone.now()
    window = WINDOWS[0]
    start = window.start(now)
    for i, minutes in enumerate((0, 0, 5)):
        Job.objects.create(
            queue=Q, job_id=f"t{i}", state=JobState.COMPLETED, created_at=start,
            finished_at=start + dt.timedelta(minutes=minutes, seconds=10),
        )  # fmt: skip
    Job.objects.create(queue=Q, job_id="old", state=JobState.COMPLETED, created_at=start,
                       finished_at=start - dt.timedelta(minutes=1))  # fmt: skip
    rollup.fold("default", now)
    completed, failed = throughput("default", Q, window, now)
    assert completed.values[0] == 2 and completed.values[5] == 1
    assert sum(completed.values) == 3 and sum(failed.values) == 0


def test_job_page_shows_the_newest_attempt_first_with_progress_collapsed(admin_client, jobq):
    import time

    from tests.helpers import wait_until

    jobq.queue.enqueue("twice", {"n": 1}, max_attempts=2)
    [first] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
    for step in range(5):
        jobq.storage.report(Q, "twice", first.token, progress=json.dumps({"step": step}).encode())
    jobq.storage.report(Q, "twice", first.token, log="first try, line 1")
    jobq.storage.report(Q, "twice", first.token, log="first try, line 2")
    jobq.storage.fail(Q, "twice", first.token, ERROR.encode(), retry_in=0)
    # The next attempt starts on a later millisecond than the first one's last log line
    # (lines carry only their time: that is how the page tells the attempts apart).
    ended = int(time.time() * 1000)
    assert wait_until(lambda: int(time.time() * 1000) > ended)
    claimed: list = []
    assert wait_until(lambda: bool(claimed.extend(jobq.storage.claim(Q, "w-2", 1, 30_000).jobs)
                                   or claimed))  # fmt: skip
    for step in range(3):
        jobq.storage.report(Q, "twice", claimed[0].token, progress=str(step).encode())
    jobq.storage.report(Q, "twice", claimed[0].token, log="second try")
    jobq.storage.complete(Q, "twice", claimed[0].token, b"1")
    page = admin_client.get(job_url(jobq, "twice"))
    events = page.context["events"]
    assert events[0]["kind"] == "completed" and events[0]["attempt"] == 2
    assert events[0]["detail"].startswith("attempt 2 ran ")
    collapsed = [(e["attempt"], e["count"]) for e in events if e["kind"] == "progress"]
    assert collapsed == [(2, 3), (1, 5)]  # one row per attempt, newest first
    assert [e["detail"] for e in events if e["kind"] == "active"] == [
        "attempt 2 of 2",
        "attempt 1 of 2",
    ]
    assert all(e["detail"] for e in events if e["kind"] != "queued"), events
    groups = [(g["attempt"], g["first"], [line for _, _, line in g["lines"]])
              for g in page.context["log_groups"]]  # fmt: skip
    assert groups == [(2, 3, ["second try"]), (1, 1, ["first try, line 1", "first try, line 2"])]
    html = page.content.decode()
    assert html.index("attempt 2 (latest)") < html.index("first try, line 1")
    assert '<ol start="3"><li><span class="jobq-ln">3</span>' in html and "progress ×5" in html


def test_job_events_are_shown_newest_first(admin_client, jobq):
    jobq.completed("done")
    row = jobq.row("done")
    events = admin_client.get(job_url(jobq, "done")).context["events"]
    assert [e["at"] for e in events] == sorted((e["at"] for e in events), reverse=True)
    assert JobEvent.objects.filter(job=row).count() == len(events)  # no progress to collapse


@pytest.mark.redis
def test_on_redis_the_job_page_shows_the_live_state_before_the_mirror_catches_up(
    admin_client, settings, redis_prefix
):
    jobq = on_redis(settings, redis_prefix)
    jobq.queue.enqueue("waiting", 1)
    url = job_url(jobq, "waiting")
    jobq.queue.cancel("waiting")  # the mirror has not read this event yet
    page = admin_client.get(url)
    assert page.context["job"].state == JobState.QUEUED
    assert page.context["live"].state is JobState.CANCELLED
    assert b"storage says" in page.content


def test_a_bulk_action_over_too_many_jobs_is_refused_whole(admin_client, jobq, monkeypatch):
    monkeypatch.setattr(actions, "MAX_BULK", 1)
    jobq.queue.enqueue_many([("a", 1), ("b", 2)])
    jobq.sync()
    pks = list(Job.objects.filter(queue=Q).values_list("pk", flat=True))
    form = {"action": "cancel_jobs", "_selected_action": pks, "confirm": "yes"}
    page = admin_client.post(reverse(CHANGELIST), form, follow=True)
    assert b"Select at most 1 jobs" in page.content
    assert jobq.state("a") is JobState.QUEUED and jobq.state("b") is JobState.QUEUED


def test_job_page_links_the_schedule_that_enqueued_the_job(admin_client, jobq):
    schedule = Schedule.objects.create(name="nightly", queue=Q, cron="0 3 * * *")
    job_id = fire_now(schedule).job_id
    related = admin_client.get(job_url(jobq, job_id)).context["related"]
    assert related == [
        (
            "enqueued by schedule",
            "nightly",
            reverse("admin:django_jobq_schedule_change", args=[schedule.pk]),
        )
    ]


def test_cancel_and_kill_of_a_running_job_asks_its_worker_through_the_queue(admin_client, jobq):
    jobq.queue.enqueue("running", 1)
    [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
    page = admin_client.get(job_url(jobq, "running"))
    assert [name for name, _, _ in page.context["actions"]] == ["cancel", "force_cancel"]
    done = admin_client.post(job_url(jobq, "running", act="force_cancel"), {"confirm": "yes"})
    assert done.status_code == 302
    lease = ("running", claimed.token)
    assert jobq.storage.cancel_requests(Q, [lease]) == {lease: True}  # True: may kill


def test_job_pages_link_flow_parents_and_children_and_hide_the_envelope(admin_client, jobq):
    from django_jobq.queue.flows import enqueue_flow, node

    parent = node(Q, "flow-parent", {"report": 1}, children=[node(Q, "flow-kid", {"n": 1})])
    enqueue_flow(parent, storage=jobq.storage)
    jobq.queue.enqueue("timed", {"n": 2}, timeout=5, hard_timeout=9)
    parent_page = admin_client.get(job_url(jobq, "flow-parent"))
    kid_url, parent_url = job_url(jobq, "flow-kid"), job_url(jobq, "flow-parent")
    assert parent_page.context["related"] == [("flow child", f"{Q}/flow-kid (queued)", kid_url)]
    assert '"report": 1' in parent_page.context["payload"]
    assert "children" not in parent_page.context["payload"]  # the envelope stays hidden
    kid_page = admin_client.get(kid_url)
    assert kid_page.context["related"] == [
        ("flow parent", f"{Q}/flow-parent (scheduled)", parent_url)
    ]
    timed = admin_client.get(job_url(jobq, "timed"))
    assert timed.context["settings"] == {"timeout": 5.0, "hard_timeout": 9.0}
    assert "hard_timeout: 9.0s" in timed.content.decode()


def test_a_parked_flow_parent_reads_waiting_for_its_children(admin_client, jobq):
    from django_jobq.queue.flows import enqueue_flow, node

    kids = [node(Q, f"kid-{n}", {"n": n}) for n in range(2)]
    enqueue_flow(node(Q, "parked", {"r": 1}, children=kids), storage=jobq.storage)
    url = job_url(jobq, "parked")
    page = admin_client.get(url)
    assert page.context["state_label"] == "waiting for 2 children"
    assert ">waiting for 2 children</span>" in page.content.decode()
    [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs  # one child finishes
    jobq.storage.complete(Q, claimed.job_id, claimed.token, b"1")
    jobq.sync()
    assert admin_client.get(url).context["state_label"] == "waiting for 1 child"
    pk = jobq.row("parked").pk
    live = admin_client.get(reverse("admin:django_jobq_job_live", args=[pk])).json()
    assert live["state"] == "scheduled" and live["label"] == "waiting for 1 child"
    listing_html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "waiting for children" in listing_html
    jobq.queue.enqueue("later", 1, delay=60_000)  # an ordinary scheduled job stays "scheduled"
    assert admin_client.get(job_url(jobq, "later")).context["state_label"] == "scheduled"


# -- the mirror behind Redis -------------------------------------------------------------------


@pytest.mark.redis
def test_job_page_offers_actions_of_the_storage_state_not_the_rows(
    admin_client, settings, redis_prefix
):
    jobq = on_redis(settings, redis_prefix)
    jobq.queue.enqueue("moved", {"n": 1})
    url = job_url(jobq, "moved")  # the row says queued
    [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
    jobq.storage.complete(Q, "moved", claimed.token, b"1")  # Redis: completed, row not yet
    page = admin_client.get(url)
    assert page.context["job"].state == "queued"
    names = [name for name, _, _ in page.context["actions"]]
    assert "cancel" not in names and "delete" in names


@pytest.mark.redis
def test_overview_oldest_waiting_agrees_with_the_counts_and_banner_shows_lag(
    admin_client, settings, redis_prefix
):
    jobq = on_redis(settings, redis_prefix)
    settings.JOBQ["MIRROR"]["LAG_WARNING"] = 0.0
    jobq.queue.enqueue("waits", {"n": 1})
    jobq.sync()
    [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
    jobq.storage.complete(Q, "waits", claimed.token, b"1")  # rows: still queued
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    row = next(r for r in page.context["rows"] if r["name"] == Q)
    assert (row["counts"]["queued"], row["oldest_age"]) == (0, None)
    assert "behind Redis" in page.context["mirror_banner"]  # two events not written yet
    jobq.sync()
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    assert page.context["mirror_banner"] is None


def test_job_ids_are_found_by_their_beginning_and_reached_by_queue_and_id(admin_client, jobq):
    for job_id in ("report-1", "report-2", "Report-3", "reporter", "report_a", "zz"):
        jobq.queue.enqueue(job_id, 1)
    jobq.sync()
    url = reverse(CHANGELIST)

    def ids(term: str) -> set[str]:
        page = admin_client.get(url, {"q": term})
        assert page.status_code == 200
        return {job.job_id for job in page.context["cl"].result_list}

    assert ids("report-") == {"report-1", "report-2"}  # case kept, "-" not a wildcard
    assert ids("report") == {"report-1", "report-2", "reporter", "report_a"}
    assert ids("report_") == {"report_a"}  # LIKE wildcards in the term are literal
    assert ids("report-2") == {"report-2"}
    assert ids("nothing") == set()
    row = Job.objects.get(queue=Q, job_id="report-2")
    link = reverse("admin:django_jobq_job_by_id", args=[Q, "report-2"])
    page = admin_client.get(link)
    assert page.status_code == 302 and page["Location"] == reverse(CHANGE, args=[row.pk])
    assert (
        admin_client.get(reverse("admin:django_jobq_job_by_id", args=[Q, "gone"])).status_code
        == 404
    )
    # A job id pasted where the row id goes leads to the job's page.
    page = admin_client.get(f"/admin/django_jobq/job/{'report-2'}/change/")
    assert page.status_code == 302 and page["Location"] == reverse(CHANGE, args=[row.pk])
    detail = admin_client.get(reverse(CHANGE, args=[row.pk]))
    assert link.encode() in detail.content


@pytest.mark.django_db(databases=["default", "pg"], transaction=True)
@pytest.mark.parametrize("alias", ["default", "pg"])
def test_id_prefix_is_exact_on_every_database(alias):
    from django_jobq.admin.jobs import id_prefix

    now = timezone.now()
    ids = ["a-1", "a-2", "A-3", "a_", "ab", "a", "b", "a\U0010ffff", "a\ud7ffx", "a\ue000"]
    Job.objects.using(alias).bulk_create(Job(queue=Q, job_id=i, created_at=now) for i in ids)
    for term in ("a", "a-", "a_", "A", "a\U0010ffff", "a\ud7ff", "zz"):
        found = set(id_prefix(Job.objects.using(alias), term).values_list("job_id", flat=True))
        assert found == {i for i in ids if i.startswith(term)}, term


def test_queue_level_retry_and_purge_of_all_dead_letters_in_chunks(
    admin_client, client, jobq, monkeypatch
):
    from django_jobq.admin import deadletters

    monkeypatch.setattr(deadletters, "CHUNK", 3)  # 7 dead letters: three chunks
    for i in range(7):
        jobq.failed(f"dead-{i}")
    jobq.sync()
    url = reverse("admin:django_jobq_queue_dead", args=[Q, "retry"])
    page = admin_client.get(url)
    assert page.status_code == 200 and b"<strong>7</strong> dead letter" in page.content
    assert jobq.queue.count_dead() == 7  # a GET only asks
    stopped = deadletters.run(Q, "retry", budget=0)  # one chunk, then it stops
    assert stopped.stopped_early and stopped.done == 3 and stopped.left == 4
    page = admin_client.post(url, {"confirm": "yes"}, follow=True)
    assert b"4 dead letter(s) requeued" in page.content
    assert jobq.queue.count_dead() == 0
    assert {jobq.state(f"dead-{i}") for i in range(7)} == {JobState.QUEUED}
    for _ in range(7):
        [claimed] = jobq.storage.claim(Q, "w-1", 1, 30_000).jobs
        jobq.storage.fail(Q, claimed.job_id, claimed.token, ERROR.encode(), permanent=True)
    purge = reverse("admin:django_jobq_queue_dead", args=[Q, "purge"])
    client.force_login(staff("viewer", "view_queueconfig"))
    assert client.post(purge, {"confirm": "yes"}).status_code == 403
    assert client.post(url, {"confirm": "yes"}).status_code == 403
    assert jobq.queue.count_dead() == 7
    page = admin_client.post(purge, {"confirm": "yes"})
    assert b"7 dead letter(s) purged" in page.content and jobq.queue.count_dead() == 0
    assert (
        admin_client.get(reverse("admin:django_jobq_queue_dead", args=[Q, "x"])).status_code == 404
    )


def test_retry_all_dead_letters_touches_each_once_while_they_keep_failing(
    admin_client, jobq, monkeypatch
):
    """Issue 37, defect 1: every round retried the newest dead letters, the ones it had just
    requeued that failed again, so the run never ended and needed a click per round. Now
    each dead letter present at the confirmation is retried once, the run goes on by itself
    across requests from that moment, and it ends."""
    from django_jobq.admin import deadletters

    monkeypatch.setattr(deadletters, "CHUNK", 4)
    ids = [f"again-{i}" for i in range(10)]
    for job_id in ids:
        jobq.failed(job_id)
    jobq.sync()
    retried: list[str] = []
    retry_many = Queue.retry_many

    def and_they_fail_again(self, job_ids):  # a handler that keeps failing, at once
        outcomes = retry_many(self, job_ids)
        retried.extend(job_ids)
        for job in jobq.storage.claim(Q, "w-2", len(job_ids), 30_000).jobs:
            jobq.storage.fail(Q, job.job_id, job.token, ERROR.encode(), permanent=True)
        return outcomes

    monkeypatch.setattr(Queue, "retry_many", and_they_fail_again)
    url = reverse("admin:django_jobq_queue_dead", args=[Q, "retry"])
    # A request cut short by its time budget goes on by itself, from the same start.
    monkeypatch.setattr(deadletters, "TIME_BUDGET", 0.0)
    first = admin_client.post(url, {"confirm": "yes"})  # one chunk
    assert b'data-jobq-autosubmit="1"' in first.content and len(retried) == 4
    since = first.context["summary"].since
    assert f'name="since" value="{since}"'.encode() in first.content
    monkeypatch.setattr(deadletters, "TIME_BUDGET", 30.0)
    page = admin_client.post(url, {"confirm": "yes", "since": str(since)})
    assert sorted(retried) == sorted(ids)  # each once
    assert b"6 dead letter(s) requeued" in page.content  # this request's; 4 before
    assert b"failed after the start were left alone" in page.content
    assert b"data-jobq-autosubmit" not in page.content  # finished: nothing to go on with
    assert jobq.queue.count_dead() == 10  # they did fail again: dead letters of a new run


@pytest.mark.parametrize(
    ("value", "fraction"),
    [
        ({"step": 20, "of": 60}, 1 / 3), ({"done": 5, "total": 5}, 1.0), (0.25, 0.25),
        (40, 0.4), ({"percent": 150}, 1.0), ({"step": 3, "of": 0}, None), ("halfway", None),
        (True, None), (float("nan"), None), (-1, None), ({"step": "x", "of": 2}, None),
        ({"n": 7, "max": 2}, 1.0), (None, None), ([1, 2], None),
    ],
)  # fmt: skip
def test_progress_bars_read_the_common_shapes_and_nothing_else(value, fraction):
    from django_jobq.admin.detail import progress_fraction

    got = progress_fraction(value)
    assert got == fraction if fraction is None else abs(got - fraction) < 1e-9


def test_job_times_never_show_a_parked_due_date_or_a_negative_wait():
    from django_jobq.admin.detail import _timing, due_at

    t = timezone.now()
    parked = Job(queue=Q, job_id="parent", created_at=t,
                 run_at=dt.datetime(9000, 1, 1, tzinfo=dt.UTC))  # fmt: skip
    assert due_at(parked) is None and _timing(parked) == []
    parked.started_at = t + dt.timedelta(seconds=2)  # ran once its children finished
    assert _timing(parked) == [("waited", "2s")]
    retried = Job(queue=Q, job_id="again", created_at=t, run_at=t + dt.timedelta(seconds=9),
                  started_at=t + dt.timedelta(seconds=1))  # fmt: skip
    assert _timing(retried) == [("waited", "1s")]
