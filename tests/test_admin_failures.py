"""Failure triage, every attempt's error on the job page, and each schedule's recent runs,
through Django's test client: on the database backend and on Redis with the model mirror,
with the rows in SQLite and in PostgreSQL. Every change goes through the Queue API."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_jobq.admin import failures
from django_jobq.admin.common import jobs_alias
from django_jobq.backend import get_storage
from django_jobq.mirror import Mirror
from django_jobq.models import Job, JobEvent
from django_jobq.queue import Queue

from .helpers import ADMIN_BACKEND_IDS, ADMIN_BACKENDS, admin_backend

Q, OTHER = "triage-a", "triage-b"
LIST = "admin:django_jobq_failures"
ACTION = "admin:django_jobq_failures_action"
pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)


def error(kind: str, message: str, traceback: str = "") -> bytes:
    return json.dumps({"type": kind, "message": message, "traceback": traceback}).encode()


class Jobs:
    """Dead letters with chosen errors on the configured storage, rows brought up to date."""

    def __init__(self, kind: str, alias: str) -> None:
        self.kind, self.alias = kind, alias
        self.storage = get_storage()

    def sync(self) -> None:
        if self.kind == "redis":
            Mirror(self.storage, queues=[Q, OTHER], using=self.alias, consumer="t").drain()

    def dead(self, queue: str, job_id: str, body: bytes) -> None:
        Queue(queue).enqueue(job_id, {"n": job_id}, max_attempts=1)
        self.fail_again(queue, job_id, body)

    def fail_again(self, queue: str, job_id: str, body: bytes) -> None:
        [claimed] = self.storage.claim(queue, "w-1", 1, 30_000).jobs
        assert claimed.job_id == job_id
        self.storage.fail(queue, job_id, claimed.token, body, permanent=True)

    def state(self, queue: str, job_id: str) -> str | None:
        status = Queue(queue).get_status(job_id)
        return None if status is None else status.state.value


@pytest.fixture(params=ADMIN_BACKENDS, ids=ADMIN_BACKEND_IDS)
def jobs(request, settings) -> Jobs:
    return Jobs(*admin_backend(request, settings))


def groups(page) -> dict[tuple[str, str], failures.Group]:
    return {(g.error_type, g.message): g for g in page.context["triage"].groups}


def key_of(page, error_type: str) -> str:
    return next(g.key for g in page.context["triage"].groups if g.error_type == error_type)


def token(page) -> str:
    match = re.search(r'name="run" value="([^"]+)"', page.content.decode())
    assert match, page.content.decode()[:3000]
    return match.group(1)


def run_to_end(client: Client, url: str, between=None) -> tuple[failures.Run, int]:
    """Confirm, then go on until the run says it finished: the run and the requests made.
    ``between`` is called before each request after the first (jobs failing meanwhile)."""
    page = client.get(url)
    requests = 0
    while True:
        if requests and between:
            between()
        page = client.post(url, {"run": token(page), "confirm": "yes"})
        requests += 1
        assert page.status_code == 200
        if page.context["run"].finished:
            return page.context["run"], requests
        assert requests < 200


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


# -- grouping -----------------------------------------------------------------------------------


def test_messages_differing_only_in_numbers_ids_and_hex_are_one_group():
    a = failures.normalise("timeout after 3.2s on job 8812")
    assert (
        a
        == failures.normalise("timeout after 17.05s on job 9911")
        == ("timeout after <n>s on job <n>")
    )
    assert failures.normalise("row 6f1c2a9e-0b7d-4c1e-9a55-0e2b4f3c8d11 gone at 0x7f3a") == (
        "row <id> gone at <id>"
    )
    assert failures.normalise("sha deadbeef12 differs") == "sha <id> differs"
    assert failures.normalise("connection refused") != failures.normalise("connection reset")


def test_failures_are_grouped_by_type_and_message_with_counts_first_last_queues_and_sample(
    admin_client, jobs
):
    for i, n in enumerate((8812, 9911, 1234)):
        jobs.dead(Q, f"t-{i}", error("TimeoutError", f"timeout after 3.{i}s on job {n}"))
    jobs.dead(OTHER, "t-other", error("TimeoutError", "timeout after 9s on job 77"))
    jobs.dead(Q, "v-0", error("ValueError", "bad input"))
    jobs.sync()
    page = admin_client.get(reverse(LIST))
    assert page.status_code == 200
    found = groups(page)
    timeout = found[("TimeoutError", "timeout after <n>s on job <n>")]
    assert timeout.count == 4 and dict(timeout.queues) == {Q: 3, OTHER: 1}
    # The sample is the newest of the group; t-other was made last, but within the same
    # millisecond as t-2 on a fast machine (Redis keeps ms), so a tie is also the newest.
    created = dict(
        Job.objects.using(jobs.alias)
        .filter(job_id__in=["t-0", "t-1", "t-2", "t-other"])
        .values_list("job_id", "created_at")
    )
    assert timeout.first <= timeout.last
    assert created[timeout.sample_id] == max(created.values()) == created["t-other"]
    assert found[("ValueError", "bad input")].count == 1
    assert list(found)[0][0] == "TimeoutError"  # biggest group first
    html = page.content.decode()
    sample = Job.objects.using(jobs_alias()).get(job_id=timeout.sample_id)
    assert reverse("admin:django_jobq_job_change", args=[sample.pk]) in html
    assert "All 5 dead letters" in html and "Grouped the newest" not in html

    one = admin_client.get(reverse(LIST), {"queue": OTHER})
    assert [(g.error_type, g.count) for g in one.context["triage"].groups] == [("TimeoutError", 1)]
    assert admin_client.get(reverse(LIST), {"queue": "no-such-queue"}).status_code == 404


def test_a_big_dead_letter_list_is_grouped_over_its_newest_rows_and_says_so(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(failures, "SAMPLE", 3)
    monkeypatch.setattr(failures, "MIN_PER_QUEUE", 3)
    for i in range(5):
        jobs.dead(Q, f"d-{i}", error("KeyError", f"'k{i}'"))
    jobs.sync()
    page = admin_client.get(reverse(LIST), {"queue": Q})
    triage = page.context["triage"]
    assert triage.read == 3 and triage.capped == [Q]
    assert sum(g.count for g in triage.groups) == 3
    created = dict(
        Job.objects.using(jobs.alias).filter(queue=Q).values_list("job_id", "created_at")
    )
    [sample] = {g.sample_id for g in triage.groups}  # the newest (d-4, or a job of its ms)
    assert created[sample] == max(created.values())
    assert "Grouped the newest 3 dead letters of each queue" in page.content.decode()


def test_the_queue_pages_link_to_their_failures(admin_client, jobs):
    jobs.dead(Q, "x", error("ValueError", "bad"))
    jobs.sync()
    overview = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist")).content
    assert f'href="{reverse(LIST)}"'.encode() in overview
    queue_page = admin_client.get(reverse("admin:django_jobq_queue_detail", args=[Q])).content
    assert f'href="{reverse(LIST)}?queue={Q}"'.encode() in queue_page


# -- retry and purge of a group -----------------------------------------------------------------


def test_retry_of_a_group_confirms_with_its_count_then_requeues_only_it_in_chunks(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(failures, "CHUNK", 2)
    monkeypatch.setattr(failures, "TIME_BUDGET", 0)  # one chunk per request
    for i in range(5):
        jobs.dead(Q, f"conn-{i}", error("ConnectionError", f"refused by 10.0.0.{i}:5432"))
    jobs.dead(Q, "other", error("ValueError", "bad input"))
    jobs.sync()
    key = key_of(admin_client.get(reverse(LIST)), "ConnectionError")
    url = reverse(ACTION, args=["retry"]) + f"?group={key}&queue={Q}"
    confirm = admin_client.get(url)
    html = confirm.content.decode()
    assert "<strong>5</strong> dead letters of this group" in html
    assert "Yes, retry this group (5)" in html and "data-jobq-autosubmit" not in html
    assert jobs.state(Q, "conn-0") == "failed"  # asking changes nothing

    first = admin_client.post(url, {"run": token(confirm), "confirm": "yes"})
    assert first.context["run"].looked == 2 and not first.context["run"].finished
    assert 'data-jobq-autosubmit="1"' in first.content.decode()  # goes on by itself
    run, _ = run_to_end(admin_client, url)
    assert run.finished
    assert {jobs.state(Q, f"conn-{i}") for i in range(5)} == {"queued"}
    assert jobs.state(Q, "other") == "failed"
    history = LogEntry.objects.filter(change_message="Retry (failure group): retried")
    assert history.count() == 5 and {e.action_flag for e in history} == {CHANGE}


def test_a_group_retried_while_its_jobs_fail_again_touches_each_dead_letter_once(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(failures, "CHUNK", 2)
    monkeypatch.setattr(failures, "TIME_BUDGET", 0)
    body = error("TimeoutError", "timeout after 3s")
    ids = [f"flaky-{i}" for i in range(6)]
    for job_id in ids:
        jobs.dead(Q, job_id, body)
    jobs.sync()
    key = key_of(admin_client.get(reverse(LIST)), "TimeoutError")
    url = reverse(ACTION, args=["retry"]) + f"?group={key}&queue={Q}"

    def worker_fails_what_was_retried() -> None:
        # The handler still fails: each job the run requeued fails again before the next
        # request, and the mirror writes it as a dead letter again.
        while claimed := jobs.storage.claim(Q, "w-2", 1, 30_000).jobs:
            jobs.storage.fail(Q, claimed[0].job_id, claimed[0].token, body, permanent=True)
        jobs.sync()

    run, requests = run_to_end(admin_client, url, between=worker_fails_what_was_retried)
    assert run.counts == {"retried": 6} and requests <= 5
    touched = LogEntry.objects.filter(change_message__startswith="Retry (failure group)")
    assert sorted(e.object_repr.split(" ")[0] for e in touched) == sorted(f"{Q}/{i}" for i in ids)


def test_purge_of_a_group_deletes_its_dead_letters_and_is_in_the_history(admin_client, jobs):
    for i in range(3):
        jobs.dead(Q, f"p-{i}", error("PermanentError", f"invoice {i} is void"))
    jobs.dead(Q, "keep", error("ValueError", "bad"))
    jobs.sync()
    key = key_of(admin_client.get(reverse(LIST)), "PermanentError")
    url = reverse(ACTION, args=["purge"]) + f"?group={key}"
    assert "Yes, purge this group (3)" in admin_client.get(url).content.decode()
    run, _ = run_to_end(admin_client, url)
    assert run.counts == {"purged": 3}
    assert [jobs.state(Q, f"p-{i}") for i in range(3)] == [None] * 3
    assert jobs.state(Q, "keep") == "failed"
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 3
    jobs.sync()
    rest = admin_client.get(reverse(LIST)).context["triage"]
    assert [g.error_type for g in rest.groups] == ["ValueError"]


def test_each_group_action_needs_its_permission_and_csrf(client, jobs):
    jobs.dead(Q, "dead", error("ValueError", "bad"))
    jobs.sync()
    viewer = staff("viewer", "view_job")
    client.force_login(viewer)
    page = client.get(reverse(LIST))
    assert page.status_code == 200
    assert b"failures/retry/" not in page.content and b"failures/purge/" not in page.content
    key = page.context["triage"].groups[0].key
    for verb in ("retry", "purge"):
        assert client.get(reverse(ACTION, args=[verb]) + f"?group={key}").status_code == 403
    client.force_login(staff("nobody"))
    assert client.get(reverse(LIST)).status_code == 403

    retrier = Client(enforce_csrf_checks=True)
    retrier.force_login(staff("retrier", "view_job", "retry_job"))
    url = reverse(ACTION, args=["retry"]) + f"?group={key}"
    confirm = retrier.get(url)
    assert confirm.status_code == 200
    assert retrier.post(url, {"run": token(confirm), "confirm": "yes"}).status_code == 403
    assert jobs.state(Q, "dead") == "failed"
    assert retrier.get(reverse(ACTION, args=["purge"]) + f"?group={key}").status_code == 403


def test_bad_group_action_requests_get_a_clear_4xx(admin_client, jobs):
    jobs.dead(Q, "dead", error("ValueError", "bad"))
    jobs.sync()
    key = key_of(admin_client.get(reverse(LIST)), "ValueError")
    retry = reverse(ACTION, args=["retry"])
    assert admin_client.get(reverse(ACTION, args=["explode"])).status_code == 404
    assert admin_client.get(retry, {"group": "<script>"}).status_code == 400
    assert admin_client.get(retry).status_code == 400
    assert admin_client.post(retry, {"run": "forged", "confirm": "yes"}).status_code == 400
    purge_run = token(admin_client.get(reverse(ACTION, args=["purge"]), {"group": key}))
    assert admin_client.post(retry, {"run": purge_run, "confirm": "yes"}).status_code == 400
    gone = admin_client.get(retry, {"group": "0" * 20})
    assert gone.status_code == 200 and b"not among the newest" in gone.content
    assert jobs.state(Q, "dead") == "failed"


def test_hostile_error_messages_are_grouped_bounded_and_escaped(admin_client, jobs):
    huge = "x" * 200_000
    jobs.dead(Q, "huge", error("MemoryError", huge, traceback="t" * 16_000))
    jobs.dead(Q, "html", error("<b>Bold</b>Error", '<script>alert("x")</script> at <img src=x>'))
    jobs.dead(Q, "intl", error("ValueError", "Ungültige Eingabe: ☃ 名前 №42 — ‮rtl"))
    jobs.dead(Q, "nul", b'"not a mapping"')
    jobs.sync()
    page = admin_client.get(reverse(LIST))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<script>alert" not in html and "&lt;script&gt;alert(&quot;x&quot;)" in html
    assert "<b>Bold</b>" not in html and "&lt;b&gt;Bold&lt;/b&gt;Error" in html
    assert "Ungültige Eingabe: ☃ 名前 №&lt;n&gt; — \u202ertl" in html
    found = groups(page)
    assert len(found[("MemoryError", "x" * failures.MESSAGE_READ)].message) == 300
    assert huge not in html and len(html) < 100_000
    assert ("Unknown", "") in found  # an error that is no mapping: no type, no message
    key = key_of(page, "<b>Bold</b>Error")
    confirm = admin_client.get(reverse(ACTION, args=["retry"]), {"group": key})
    assert "&lt;script&gt;" in confirm.content.decode()
    run, _ = run_to_end(admin_client, reverse(ACTION, args=["retry"]) + f"?group={key}")
    assert run.counts == {"retried": 1} and jobs.state(Q, "html") == "queued"


# -- every attempt's error on the job page ----------------------------------------------------


def fail_attempts(jobs: Jobs, job_id: str, messages: list[str], *, last_permanent: bool) -> None:
    """Run ``job_id`` once per message, each attempt failing with it."""
    Queue(Q).enqueue(job_id, {}, max_attempts=len(messages) + 1)
    for i, message in enumerate(messages):
        [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
        permanent = last_permanent and i == len(messages) - 1
        body = error("IOError", message, traceback=f"Traceback (most recent call last):\n  #{i}")
        jobs.storage.fail(Q, job_id, claimed.token, body, retry_in=0, permanent=permanent)


def test_the_job_page_shows_every_attempts_error_newest_first(admin_client, jobs):
    fail_attempts(jobs, "thrice", ["disk full on /a", "disk full on /b", "<gone> ☃"],
                  last_permanent=True)  # fmt: skip
    jobs.sync()
    row = Job.objects.using(jobs_alias()).get(queue=Q, job_id="thrice")
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[row.pk]))
    rows = page.context["attempt_errors"]["rows"]
    assert [(r["attempt"], r["kind"], r["error"]["message"]) for r in rows] == [
        (3, "failed", "<gone> ☃"), (2, "retrying", "disk full on /b"),
        (1, "retrying", "disk full on /a"),
    ]  # fmt: skip
    assert not page.context["attempt_errors"]["gone"]
    html = page.content.decode()
    assert html.count('class="jobq-attempt-error"') == 3 and "&lt;gone&gt; ☃" in html
    assert "Traceback (most recent call last):\n  #0" in html  # collapsed in its <details>


def test_an_error_too_big_for_its_event_is_said_so_and_the_last_comes_from_the_row(
    admin_client, jobs
):
    Queue(Q).enqueue("big", {}, max_attempts=2)
    for i, permanent in enumerate((False, True)):
        [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
        body = error("ValueError", f"attempt {i}", traceback="frame\n" * 400)  # > 1 KiB
        jobs.storage.fail(Q, "big", claimed.token, body, retry_in=0, permanent=permanent)
    jobs.sync()
    row = Job.objects.using(jobs_alias()).get(queue=Q, job_id="big")
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[row.pk]))
    newest, oldest = page.context["attempt_errors"]["rows"]
    assert newest["error"]["message"] == "attempt 1"  # Job.error
    assert oldest["error"] is None and oldest["omitted"]
    assert "over 1 KiB and is not kept" in page.content.decode()


def test_attempts_whose_events_are_gone_are_said_to_be_gone(admin_client, jobs):
    fail_attempts(jobs, "long", ["first", "second", "third"], last_permanent=True)
    jobs.sync()
    row = Job.objects.using(jobs_alias()).get(queue=Q, job_id="long")
    # Retention / trimming took the first attempt's events (the oldest of the job).
    oldest = list(JobEvent.objects.using(jobs_alias()).filter(job=row).order_by("at", "id"))
    first_end = next(i for i, e in enumerate(oldest) if e.kind == "retrying")
    JobEvent.objects.using(jobs_alias()).filter(pk__in=[e.pk for e in oldest[: first_end + 1]]
                                                ).delete()  # fmt: skip
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[row.pk]))
    attempts = page.context["attempt_errors"]
    assert [(r["attempt"], r["error"]["message"]) for r in attempts["rows"]] == [
        (3, "third"),
        (2, "second"),
    ]
    assert attempts["gone"] and attempts["missing"] == 1
    assert "The events of 1 earlier attempt are gone" in page.content.decode()


@pytest.mark.redis
def test_attempts_trimmed_from_the_redis_stream_before_the_mirror_read_them(
    admin_client, settings, redis_prefix, redis_client
):
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix,
                     "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": "default"}}  # fmt: skip
    jobs = Jobs("redis", "default")
    jobs.sync()  # the mirror's group exists: a trim after this is a gap it finds
    fail_attempts(jobs, "trimmed", ["one", "two"], last_permanent=False)
    redis_client.xtrim(jobs.storage.keys(Q).events, maxlen=0)  # the stream's cap at work
    [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
    jobs.storage.fail(Q, "trimmed", claimed.token, error("IOError", "three"), permanent=True)
    mirror = Mirror(jobs.storage, queues=[Q], using="default", consumer="t")
    mirror.check_gaps()
    mirror.drain()
    row = Job.objects.get(queue=Q, job_id="trimmed")
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[row.pk]))
    attempts = page.context["attempt_errors"]
    assert attempts["rows"][0]["attempt"] == 3 and attempts["rows"][0]["error"]["message"] == (
        "three"
    )
    assert attempts["gone"] and attempts["missing"] == 2
    assert b"earlier attempts are gone" in page.content


# -- each schedule's recent runs ----------------------------------------------------------------


def test_a_schedule_shows_its_recent_runs_with_state_and_duration(admin_client, jobs, monkeypatch):
    from django_jobq.admin import schedules as schedule_admin
    from django_jobq.models import Schedule
    from django_jobq.schedules.core import fire_now, tick_job_id

    monkeypatch.setattr(schedule_admin, "RUNS_IN_LIST", 3)
    nightly = Schedule.objects.create(name="nightly", queue=Q, interval=60)
    Schedule.objects.create(name="nightly.1", queue=Q, interval=60)  # a name sharing the prefix
    base = 1_796_000_000
    ticks = [dt.datetime.fromtimestamp(base + 60 * i, tz=dt.UTC) for i in range(4)]
    for tick in ticks:
        Queue(Q).enqueue(tick_job_id("nightly", tick), {})
    Queue(Q).enqueue(tick_job_id("nightly.1", ticks[0]), {})
    for outcome in ("complete", "fail"):  # the two oldest ticks ran: one completed, one failed
        [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
        if outcome == "complete":
            jobs.storage.complete(Q, claimed.job_id, claimed.token, b"{}")
        else:
            jobs.storage.fail(Q, claimed.job_id, claimed.token, error("E", "x"), permanent=True)
    manual = fire_now(nightly)
    jobs.sync()

    runs = schedule_admin.recent_runs(nightly)
    assert [r["job_id"] for r in runs] == [manual.job_id] + [
        tick_job_id("nightly", t) for t in reversed(ticks)
    ]
    assert [r["state"] for r in runs][-2:] == ["failed", "completed"]
    assert runs[-1]["duration"] and runs[0]["duration"] == ""

    page = admin_client.get(reverse("admin:django_jobq_schedule_change", args=[nightly.pk]))
    html = page.content.decode()
    assert page.status_code == 200 and 'id="jobq-recent-runs"' in html
    assert html.count('<span class="jobq-state jobq-state-') >= 5
    assert tick_job_id("nightly.1", ticks[0]) not in html
    listing = admin_client.get(reverse("admin:django_jobq_schedule_changelist")).content.decode()
    assert listing.count('class="jobq-runs"') == 2 and "column-recent" in listing
