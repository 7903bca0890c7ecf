"""Job list actions over a whole filter ("Select all N jobs matching this filter"): any
number of jobs, chunked through the Queue API, on the database backend and on Redis with the
model mirror, with the rows in SQLite and in PostgreSQL."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core import signing
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_jobq.admin import filtered
from django_jobq.backend import get_storage
from django_jobq.mirror import Mirror
from django_jobq.models import Job
from django_jobq.queue import Queue

from .helpers import ADMIN_BACKEND_IDS, ADMIN_BACKENDS, admin_backend

Q, OTHER = "filtered-a", "filtered-b"
CHANGELIST = "admin:django_jobq_job_changelist"
ERROR = json.dumps({"type": "ValueError", "message": "bad", "traceback": ""}).encode()
pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)


class Jobs:
    """Jobs in known states on the configured storage, and their rows brought up to date."""

    def __init__(self, kind: str, alias: str) -> None:
        self.kind, self.alias = kind, alias
        self.storage = get_storage()

    def sync(self) -> None:
        if self.kind == "redis":
            Mirror(self.storage, queues=[Q, OTHER], using=self.alias, consumer="f").drain()

    def make(self, queue: str, job_id: str, state: str) -> None:
        Queue(queue).enqueue(job_id, {"n": job_id}, max_attempts=1,
                             delay=3_600_000 if state == "scheduled" else None)  # fmt: skip
        if state in ("failed", "completed"):
            [claimed] = self.storage.claim(queue, "w-1", 1, 30_000).jobs
            assert claimed.job_id == job_id
            if state == "failed":
                self.storage.fail(queue, job_id, claimed.token, ERROR, permanent=True)
            else:
                self.storage.complete(queue, job_id, claimed.token, b"{}")
        elif state == "cancelled":
            Queue(queue).cancel(job_id)

    def state(self, queue: str, job_id: str) -> str | None:
        status = Queue(queue).get_status(job_id)
        return None if status is None else status.state.value


@pytest.fixture(params=ADMIN_BACKENDS, ids=ADMIN_BACKEND_IDS)
def jobs(request, settings) -> Jobs:
    return Jobs(*admin_backend(request, settings))


def start(client: Client, action: str, query: str) -> str:
    """Tick every row, "Select all … matching this filter", pick the action: the redirect."""
    pks = list(Job.objects.using(get_alias()).values_list("pk", flat=True)[:1])
    form = {"action": f"{action}_jobs", "_selected_action": pks, "select_across": "1",
            "index": 0}  # fmt: skip
    response = client.post(f"{reverse(CHANGELIST)}?{query}", form)
    assert response.status_code == 302, response.content[:500]
    return response["Location"]


def get_alias() -> str:
    from django_jobq.admin.common import jobs_alias

    return jobs_alias()


def run_token(page) -> str:
    match = re.search(r'name="run" value="([^"]+)"', page.content.decode())
    assert match, page.content.decode()[:2000]
    return match.group(1)


def run_all(client: Client, url: str) -> tuple[filtered.Run, int]:
    """Confirm, then go on until the run says it finished: the run and the requests made."""
    page = client.get(url)
    requests = 0
    if page.context["run"].total == 0:
        assert b"nothing to do" in page.content and b'name="run"' not in page.content
        return page.context["run"], requests
    while True:
        page = client.post(url, {"run": run_token(page), "confirm": "yes"})
        requests += 1
        assert page.status_code == 200
        run = page.context["run"]
        if run.finished:
            return run, requests
        assert requests < 100


def test_select_all_of_a_filter_asks_with_the_count_and_the_filter_then_runs_in_chunks(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(filtered, "CHUNK", 3)  # 7 dead letters: three chunks
    for i in range(7):
        jobs.make(Q, f"dead-{i}", "failed")
    jobs.make(Q, "fine", "completed")
    jobs.make(OTHER, "elsewhere", "failed")
    jobs.sync()
    url = start(admin_client, "retry", f"queue={Q}&state__exact=failed&o=3&p=1")
    assert url.startswith(reverse("admin:django_jobq_job_filter_action", args=["retry"]))
    assert "p=" not in url and "o=" not in url  # page and sort do not narrow the set
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "<strong>7</strong> jobs match" in html
    assert f"queue = {Q}" in html and "state = Failed" in html
    assert jobs.state(Q, "dead-0") == "failed"  # asking changes nothing
    run, _ = run_all(admin_client, url)
    assert dict(run.counts) == {"retried": 7} and run.done == 7 and run.total == 7
    assert {jobs.state(Q, f"dead-{i}") for i in range(7)} == {"queued"}
    assert jobs.state(Q, "fine") == "completed" and jobs.state(OTHER, "elsewhere") == "failed"
    history = LogEntry.objects.filter(change_message__startswith="Retry (over a filter)")
    assert history.count() == 7
    assert {e.object_repr.split(" ")[0] for e in history} == {f"{Q}/dead-{i}" for i in range(7)}


def test_a_run_stops_at_its_time_budget_and_goes_on_from_its_cursor(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(filtered, "TIME_BUDGET", 0)  # one job per request
    for i in range(3):
        jobs.make(Q, f"wait-{i}", "queued")
    jobs.sync()
    url = start(admin_client, "cancel", f"queue={Q}")
    first = admin_client.post(url, {"run": run_token(admin_client.get(url)), "confirm": "yes"})
    run = first.context["run"]
    assert (run.handled, run.finished, first.context["left"]) == (1, False, 2)
    html = first.content.decode()
    assert 'data-jobq-autosubmit="1"' in html and "2 left" in html
    assert sum(jobs.state(Q, f"wait-{i}") == "cancelled" for i in range(3)) == 1
    again = admin_client.post(url, {"run": run_token(first), "confirm": "yes"})
    assert again.context["run"].counts == {"cancelled": 2}
    jobs.sync()
    run, _ = run_all(admin_client, url)  # a new run: only what is left to cancel
    assert run.total == 1 and dict(run.counts) == {"cancelled": 1}
    assert {jobs.state(Q, f"wait-{i}") for i in range(3)} == {"cancelled"}


def test_jobs_that_change_or_arrive_after_the_confirmation_are_never_swept_in(admin_client, jobs):
    for job_id in ("a", "b", "c"):
        jobs.make(Q, job_id, "queued")
    jobs.sync()
    url = start(admin_client, "cancel", f"queue={Q}")
    page = admin_client.get(url)
    assert page.context["run"].total == 3
    # Meanwhile: a worker finishes "a" (the mirror may not have seen it yet), "late" arrives.
    [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
    jobs.storage.complete(Q, claimed.job_id, claimed.token, b"{}")
    Queue(Q).enqueue("late", 1)
    jobs.sync()
    done = admin_client.post(url, {"run": run_token(page), "confirm": "yes"})
    run = done.context["run"]
    assert run.finished and run.counts["cancelled"] == 2
    assert jobs.state(Q, claimed.job_id) == "completed"  # left alone (or counted "completed")
    assert set(run.counts) <= {"cancelled", "completed"}
    assert jobs.state(Q, "late") == "queued"  # arrived after the confirmation


def test_over_a_filter_each_action_needs_its_permission_and_csrf(client, jobs):
    jobs.make(Q, "dead", "failed")
    jobs.sync()
    retry = reverse("admin:django_jobq_job_filter_action", args=["retry"]) + f"?queue={Q}"
    delete = reverse("admin:django_jobq_job_filter_action", args=["delete"]) + f"?queue={Q}"
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    assert client.get(retry).status_code == 403
    retrier = User.objects.create_user("retrier", password="pw", is_staff=True)
    for codename in ("view_job", "retry_job"):
        retrier.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(retrier)
    page = client.get(retry)
    assert page.status_code == 200
    token = run_token(page)
    assert client.get(delete).status_code == 403
    assert client.post(delete, {"run": token, "confirm": "yes"}).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(retrier)
    assert strict.post(retry, {"run": token, "confirm": "yes"}).status_code == 403  # no token
    assert jobs.state(Q, "dead") == "failed"
    assert client.post(retry, {"run": token, "confirm": "yes"}).status_code == 200
    assert jobs.state(Q, "dead") == "queued"


def test_the_confirmation_states_every_kind_of_filter_and_search(admin_client, jobs):
    jobs.make(Q, "report-1", "failed")
    jobs.sync()
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    since = urlencode({"finished_at__gte": str(today)})  # the "Today" link's own value
    until = urlencode({"finished_at__lt": str(today + dt.timedelta(days=1))})
    query = f"queue={Q}&handler=h&worker=w&created=1h&state__exact=failed&q=report-&{since}&{until}"
    url = reverse("admin:django_jobq_job_filter_action", args=["retry"]) + f"?{query}"
    page = admin_client.get(url)
    assert page.status_code == 200
    shown = page.context["filter"]
    assert f"queue = {Q}" in shown and "handler = h" in shown and "worker = w" in shown
    assert "created within = Last hour" in shown and "state = Failed" in shown
    assert "finished at = Today" in shown and "search “report-”" in shown
    assert page.context["run"].total == 0  # no job has handler "h"
    odd = admin_client.get(url.replace(until, "finished_at__lt=2030-01-01"))
    assert "finished at = finished_at__gte" in " ".join(odd.context["filter"])
    bad = admin_client.get(url + "&queue__nonsense=1")
    assert bad.status_code == 400 and b"not valid" in bad.content


def test_a_damaged_run_or_an_action_not_offered_over_a_filter_is_refused(admin_client, jobs):
    jobs.make(Q, "dead", "failed")
    jobs.sync()
    url = reverse("admin:django_jobq_job_filter_action", args=["retry"]) + f"?queue={Q}"
    token = run_token(admin_client.get(url))
    forged = signing.dumps({"n": "retry", "q": "", "u": 10**9, "t": 1, "c": None, "o": {},
                            "k": []}, salt="another-salt", compress=True)  # fmt: skip
    for bad in (token[:-3] + "abc", forged, ""):
        page = admin_client.post(url, {"run": bad, "confirm": "yes"})
        assert page.status_code == 400 and b"damaged" in page.content
    delete = reverse("admin:django_jobq_job_filter_action", args=["delete"])
    assert admin_client.post(delete, {"run": token, "confirm": "yes"}).status_code == 400
    run_now = reverse("admin:django_jobq_job_filter_action", args=["run_now"])
    assert admin_client.get(run_now).status_code == 400
    assert jobs.state(Q, "dead") == "failed"


def test_a_storage_error_stops_the_run_before_that_job_and_the_next_request_goes_on(
    admin_client, jobs, monkeypatch
):
    from django_jobq.admin import actions

    for i in range(3):
        jobs.make(Q, f"dead-{i}", "failed")
    jobs.sync()
    url = reverse("admin:django_jobq_job_filter_action", args=["retry"]) + f"?queue={Q}"
    token = run_token(admin_client.get(url))
    real, calls = actions._retry, itertools.count()

    def flaky(job, extra):
        if next(calls) == 1:
            raise ConnectionError("storage went away")
        return real(job, extra)

    monkeypatch.setitem(actions.ACTIONS, "retry", actions.ACTIONS["retry"].__class__(
        **{**actions.ACTIONS["retry"].__dict__, "run": flaky}))  # fmt: skip
    stopped = admin_client.post(url, {"run": token, "confirm": "yes"})
    run = stopped.context["run"]
    assert run.error and "storage went away" in run.error and run.counts == {"retried": 1}
    assert b"Stopped by a storage error" in stopped.content
    resumed = admin_client.post(url, {"run": run_token(stopped), "confirm": "yes"})
    assert resumed.context["run"].counts == {"retried": 3}  # the failed one tried again
    assert {jobs.state(Q, f"dead-{i}") for i in range(3)} == {"queued"}


STATES = ("queued", "scheduled", "failed", "completed", "cancelled")
AFTER = {"cancel": "cancelled", "retry": "queued", "requeue_dead": "queued", "delete": None}
serial = itertools.count()


@pytest.mark.parametrize("jobs", [("database", "default")], indirect=True, ids=["sqlite"])
@hsettings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    made=st.lists(st.tuples(st.sampled_from((Q, OTHER)), st.sampled_from(STATES)), max_size=9),
    queue=st.sampled_from(("", Q, OTHER)),
    state=st.sampled_from(("", *STATES)),
    action=st.sampled_from(sorted(AFTER)),
    chunk=st.integers(1, 4),
)
def test_a_run_changes_exactly_the_jobs_of_the_filter_in_the_actions_states(
    admin_client, jobs, made, queue, state, action, chunk
):
    """Whatever the jobs, filter, action and chunk size: every job the filter matched in a
    state the action applies to got the action once, and no other job changed."""
    filtered.CHUNK = chunk
    try:
        n = next(serial)
        Job.objects.using(get_alias()).all().delete()  # the database backend: jobs gone
        # Finished ones first: each is claimed as the only waiting job of its queue.
        made = sorted(made, key=lambda m: m[1] in ("queued", "scheduled"))
        ids = [(q, f"p{n}-{i}", s) for i, (q, s) in enumerate(made)]
        for q, job_id, s in ids:
            jobs.make(q, job_id, s)
        jobs.sync()
        query = "&".join(f"{k}={v}" for k, v in (("queue", queue), ("state__exact", state)) if v)
        url = reverse("admin:django_jobq_job_filter_action", args=[action]) + f"?{query}"
        applies = {s.value for s in filtered.ACTIONS[action].over_a_filter}
        hit = {(q, j) for q, j, s in ids if queue in ("", q) and state in ("", s) and s in applies}
        before = {(q, j): jobs.state(q, j) for q, j, _ in ids}
        run, _ = run_all(admin_client, url)
        assert run.total == len(hit) and run.done == len(hit), (run.counts, hit)
        for key, was in before.items():
            assert jobs.state(*key) == (AFTER[action] if key in hit else was), key
    finally:
        filtered.CHUNK = 500
