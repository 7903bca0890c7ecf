"""Jobs by hand in the admin (issue 37): the job form (add, duplicate), run again, reschedule,
promote all delayed, and the job page's live log box. Through Django's test client on the
database backend (rows in SQLite and in PostgreSQL) and on Redis with the model mirror; every
change goes through the Queue API, asks its permission, keeps CSRF and is in the history."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_jobq.admin import filtered
from django_jobq.admin.byhand.forms import LOCAL_FORMAT
from django_jobq.admin.common import jobs_alias
from django_jobq.backend import get_storage
from django_jobq.mirror import Mirror
from django_jobq.models import Job
from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue
from django_jobq.queue.sharding import route
from django_jobq.states import JobState
from django_jobq.tasks import task
from django_jobq.tasks.registry import registry

from .helpers import ADMIN_BACKEND_IDS, ADMIN_BACKENDS, admin_backend

Q = "byhand-a"
ERROR = json.dumps({"type": "ValueError", "message": "bad", "traceback": ""}).encode()
ADD = "admin:django_jobq_job_byhand_add"
pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)


class Jobs:
    """Jobs in known states on the configured storage, and their rows brought up to date."""

    def __init__(self, kind: str, alias: str) -> None:
        self.kind, self.alias = kind, alias
        self.storage = get_storage()

    def sync(self, *queues: str) -> None:
        if self.kind == "redis":
            names = list(queues) or [Q]
            Mirror(self.storage, queues=names, using=self.alias, consumer="byhand").drain()

    def make(self, job_id: str, state: str, queue: str = Q, **options) -> Job:
        delay = 3_600_000 if state == "scheduled" else None
        Queue(queue).enqueue(job_id, {"n": job_id}, delay=delay, **options)
        if state in ("failed", "completed", "active"):
            [claimed] = self.storage.claim(queue, "w-1", 1, 30_000).jobs
            assert claimed.job_id == job_id
            if state == "failed":
                self.storage.fail(queue, job_id, claimed.token, ERROR, permanent=True)
            elif state == "completed":
                self.storage.complete(queue, job_id, claimed.token, b"{}")
        elif state == "cancelled":
            Queue(queue).cancel(job_id)
        self.sync(queue)
        return self.row(job_id, queue)

    def row(self, job_id: str, queue: str = Q) -> Job:
        return Job.objects.using(self.alias).get(queue=queue, job_id=job_id)

    def status(self, job_id: str, queue: str = Q):
        return Queue(queue).get_status(job_id)


@pytest.fixture(params=ADMIN_BACKENDS, ids=ADMIN_BACKEND_IDS)
def jobs(request, settings) -> Jobs:
    return Jobs(*admin_backend(request, settings))


def form(**fields) -> dict[str, str]:
    """The job form as a browser sends it: every field, most of them blank."""
    data = {name: "" for name in ("job_id", "handler", "payload", "priority", "max_attempts",
                                  "run_at", "delay", "max_stalls", "min_backoff", "max_backoff",
                                  "result_ttl", "group", "timeout", "hard_timeout")}  # fmt: skip
    data["queue"] = Q
    data.update({k: str(v) for k, v in fields.items()})
    return data


def new_job_id(response) -> str:
    """The id of the job a by-hand view enqueued, from its redirect to the new job's page."""
    assert response.status_code == 302, response.content.decode()[:3000]
    match = re.search(r"[?&]id=([^&]+)", response["Location"])
    assert match, response["Location"]
    return match.group(1)


def nothing_stored(queue: str = Q) -> bool:
    return not any(Queue(queue).counts().values())


def staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


# -- the job form ------------------------------------------------------------------------------


def test_a_job_from_the_form_is_enqueued_with_its_options_and_shown_on_its_page(admin_client, jobs):
    Queue(Q).enqueue("seed", 1)  # the queue exists
    response = admin_client.post(reverse(ADD), form(
        job_id="by-hand-1", payload='{"to": "ops@example.com", "n": [1, 2]}', priority=-7,
        max_attempts=9, max_stalls=2, min_backoff=50, group="g1", timeout=2.5,
    ))  # fmt: skip
    assert new_job_id(response) == "by-hand-1"
    status = jobs.status("by-hand-1")
    assert status.state is JobState.QUEUED and status.priority == -7
    assert status.max_attempts == 9 and status.group == "g1"
    assert Queue(Q).get_payload("by-hand-1") == {"to": "ops@example.com", "n": [1, 2]}
    landing = admin_client.get(response["Location"])
    if jobs.kind == "redis" and landing.status_code == 200:  # the mirror has not written it
        shown = landing.content.decode()
        assert "the storage says" in shown and "queued" in shown
        jobs.sync()
        landing = admin_client.get(response["Location"])
    row = jobs.row("by-hand-1")
    assert landing.status_code == 302
    assert landing["Location"] == reverse("admin:django_jobq_job_change", args=[row.pk])
    if jobs.kind == "database":
        shown = admin_client.get(landing["Location"]).content.decode()
    assert "Enqueued job" in shown and 'id="jobq-new-job"' in shown  # the message, its link
    entry = LogEntry.objects.get(action_flag=ADDITION, object_repr=f"{Q}/by-hand-1")
    assert entry.change_message.startswith("Enqueued by hand")


def test_a_blank_id_gets_a_fresh_one_and_a_delay_schedules_it(admin_client, jobs):
    Queue(Q).enqueue("seed", 1)
    job_id = new_job_id(admin_client.post(reverse(ADD), form(payload="[1]", delay=3600)))
    assert len(job_id) == 32 and job_id != "seed"
    status = jobs.status(job_id)
    assert status.state is JobState.SCHEDULED
    assert status.run_at > timezone.now() + dt.timedelta(minutes=59)


def test_a_time_to_run_at_is_read_in_the_admins_time_zone(admin_client, jobs, settings):
    settings.TIME_ZONE = "Asia/Kathmandu"  # +05:45: an offset no test machine has by chance
    Queue(Q).enqueue("seed", 1)
    later = timezone.now().astimezone(dt.timezone(dt.timedelta(hours=5, minutes=45)))
    later = (later + dt.timedelta(days=2)).replace(microsecond=0)
    at = later.strftime(LOCAL_FORMAT)
    job_id = new_job_id(admin_client.post(reverse(ADD), form(payload="1", run_at=at)))
    assert jobs.status(job_id).run_at == later


def test_an_id_that_exists_says_so_links_to_that_job_and_enqueues_nothing(admin_client, jobs):
    jobs.make("dup-1", "completed")
    before = Queue(Q).get_payload("dup-1")
    page = admin_client.post(reverse(ADD), form(job_id="dup-1", payload='{"other": true}'))
    assert page.status_code == 200
    html = page.content.decode()
    assert "exists already" in html and "nothing was enqueued" in html
    link = re.search(r'<a href="([^"]+)" id="jobq-existing">', html).group(1).replace("&amp;", "&")
    landing = admin_client.get(link)
    assert landing["Location"] == reverse("admin:django_jobq_job_change",
                                          args=[jobs.row("dup-1").pk])  # fmt: skip
    assert Queue(Q).get_payload("dup-1") == before
    assert jobs.status("dup-1").state is JobState.COMPLETED
    assert not LogEntry.objects.filter(action_flag=ADDITION).exists()


BAD_INPUT = {
    "invalid JSON": ({"payload": '{"a": 1,}'}, "payload", "Not valid JSON"),
    "NaN": ({"payload": '{"a": NaN}'}, "payload", "NaN is not JSON"),
    "infinity": ({"payload": "[-Infinity]"}, "payload", "Infinity is not JSON"),
    "a float too big": ({"payload": "[1e999]"}, "payload", "too big for a float"),
    "nesting": ({"payload": "[" * 200_000 + "]" * 200_000}, "payload", "nested too deeply"),
    "oversize": ({"payload": json.dumps("x" * 5000)}, "payload", "payload"),
    "bad queue name": ({"queue": "a b{c}"}, "queue", "invalid queue name"),
    "a partition's name": ({"queue": "byhand-a~0of2"}, "queue", "invalid queue name"),
    "bad job id": ({"job_id": "-x:y"}, "job_id", "invalid job id"),
    "priority out of range": ({"priority": "5000"}, "priority", "less than or equal"),
    "NaN timeout": ({"timeout": "nan"}, "timeout", "Enter a number"),
    "time and delay": ({"run_at": "2030-01-01T10:00", "delay": "5"}, "delay", "not both"),
    "time past year 9999": ({"run_at": "99999-01-01T10:00"}, "run_at", "valid date"),
    "far future": ({"run_at": "9500-01-01T10:00"}, "run_at", "ten years"),
    "unknown handler": ({"handler": "no.such.thing"}, "handler", "No handler"),
    "bad group": ({"group": "{x}"}, "group", "group"),
    "an unknown queue": ({"queue": "nobody-made-this"}, "queue", "Create this"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_shows_the_error_on_its_field_and_enqueues_nothing(
    admin_client, jobs, settings, case
):
    settings.JOBQ = {**settings.JOBQ, "MAX_PAYLOAD_BYTES": 1000}
    Queue(Q)._register()  # the queue exists: only the input is wrong
    fields, field, text = BAD_INPUT[case]
    page = admin_client.post(reverse(ADD), form(**{"payload": "1", **fields}))
    assert page.status_code == 200
    errors = page.context["form"].errors
    assert field in errors and text in " ".join(errors[field]), errors
    assert b'id="jobq-form-error"' in page.content
    assert nothing_stored() and "nobody-made-this" not in get_storage().list_queues()


def test_a_new_queue_is_created_only_when_asked(admin_client, jobs):
    fields = form(queue="byhand-new", payload="1")
    refused = admin_client.post(reverse(ADD), fields)
    assert refused.status_code == 200 and b'name="new_queue"' in refused.content
    assert "byhand-new" not in get_storage().list_queues()
    job_id = new_job_id(admin_client.post(reverse(ADD), {**fields, "new_queue": "on"}))
    assert Queue("byhand-new").get_status(job_id).state is JobState.QUEUED


def test_a_task_is_chosen_by_its_name(admin_client, jobs):
    greet = task(queue=Q, name="byhand.greet")(lambda name: f"hello {name}")
    try:
        Queue(Q).enqueue("seed", 1)
        job_id = new_job_id(admin_client.post(
            reverse(ADD), form(handler="byhand.greet", payload='{"args": ["ops"], "kwargs": {}}')
        ))  # fmt: skip
        assert jobs.status(job_id).task == "byhand.greet"
        page = admin_client.get(reverse(ADD), {"queue": Q}).content.decode()
        assert '<option value="byhand.greet">' in page  # offered by name
    finally:
        registry.unregister_task(greet.name)


def test_the_form_is_prefilled_from_a_queue_page(admin_client, jobs):
    Queue(Q).enqueue("seed", 1)
    page = admin_client.get(reverse(ADD), {"queue": Q})
    assert page.status_code == 200 and page.context["form"]["queue"].value() == Q
    queue_page = admin_client.get(reverse("admin:django_jobq_queue_detail", args=[Q]))
    assert f'{reverse(ADD)}?queue={Q}"' in queue_page.content.decode()


# -- duplicate and run again --------------------------------------------------------------------


def test_duplicate_prefills_the_form_and_enqueues_the_edited_copy(admin_client, jobs):
    source = jobs.make("orig", "failed", priority=4, max_attempts=6, group="g2")
    url = reverse("admin:django_jobq_job_duplicate", args=[source.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    initial = page.context["form"].initial
    assert initial["queue"] == Q and initial["priority"] == 4 and initial["max_attempts"] == 6
    assert initial["payload"] == '{\n  "n": "orig"\n}' and initial["group"] == "g2"
    edited = form(**{k: v for k, v in initial.items() if v is not None and k != "lifo"})
    edited["payload"] = '{"n": "edited"}'
    job_id = new_job_id(admin_client.post(url, edited))
    assert job_id != "orig"
    assert Queue(Q).get_payload(job_id) == {"n": "edited"}
    status = jobs.status(job_id)
    assert (status.priority, status.max_attempts, status.group) == (4, 6, "g2")
    assert Queue(Q).get_payload("orig") == {"n": "orig"}  # the job itself is not changed
    assert jobs.status("orig").state is JobState.FAILED
    assert LogEntry.objects.filter(action_flag=CHANGE, change_message__startswith="Duplicated as",
                                   object_id=str(source.pk)).count() == 1  # fmt: skip


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
def test_run_again_enqueues_a_copy_of_a_finished_job_under_a_new_id(admin_client, jobs, state):
    source = jobs.make("once", state, priority=3, max_attempts=5, timeout=7)
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[source.pk]))
    assert b'id="jobq-run-again"' in page.content
    response = admin_client.post(reverse("admin:django_jobq_job_again", args=[source.pk]))
    job_id = new_job_id(response)
    assert job_id != "once"
    status = jobs.status(job_id)
    assert status.state is JobState.QUEUED and (status.priority, status.max_attempts) == (3, 5)
    assert Queue(Q).get_payload(job_id) == {"n": "once"}
    jobs.sync()
    new = jobs.row(job_id)
    assert new.content_type == "json+env"  # the timeout travelled in the envelope
    assert jobs.status("once").state.value == state  # the job itself stays as it was
    assert LogEntry.objects.filter(change_message=f"Run again as {Q}/{job_id}").count() == 1
    assert LogEntry.objects.filter(action_flag=ADDITION, object_repr=f"{Q}/{job_id}").exists()


def test_run_again_is_a_post_and_only_for_a_finished_job(admin_client, jobs):
    waiting = jobs.make("waiting", "queued")
    url = reverse("admin:django_jobq_job_again", args=[waiting.pk])
    assert admin_client.get(url).status_code == 302
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[waiting.pk]))
    assert b'id="jobq-run-again"' not in page.content
    response = admin_client.post(url, follow=True)
    assert b"only a finished job can be run again" in response.content
    assert Queue(Q).counts()[JobState.QUEUED] == 1


def test_run_again_keeps_a_task_jobs_task(admin_client, jobs):
    greet = task(queue=Q, name="byhand.greet2")(lambda name: name)
    try:
        result = greet.enqueue("ops")
        [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
        jobs.storage.complete(Q, claimed.job_id, claimed.token, b'"ops"')
        jobs.sync()
        source = jobs.row(result.job_id)
        job_id = new_job_id(admin_client.post(
            reverse("admin:django_jobq_job_again", args=[source.pk])))  # fmt: skip
        assert jobs.status(job_id).task == "byhand.greet2"
        assert Queue(Q).get_payload(job_id) == Queue(Q).get_payload(result.job_id)
    finally:
        registry.unregister_task(greet.name)


@pytest.mark.parametrize("kind", ["database", pytest.param("redis", marks=pytest.mark.redis)])
def test_run_again_in_a_sharded_queue_routes_the_copy_by_its_own_id(admin_client, settings,
                                                                     request, kind):  # fmt: skip
    """The row names its partition; the copy goes through the logical queue, so it lands in
    the partition its new id routes to (not necessarily the source's) and is found there."""
    backend = {"BACKEND": "database", "DATABASE_ALIAS": "default"}
    if kind == "redis":
        backend = {"BACKEND": "redis", "PREFIX": request.getfixturevalue("redis_prefix"),
                   "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": "default"}}  # fmt: skip
    settings.JOBQ = {**settings.JOBQ, **backend, "QUEUES": {"byhand-sh": {"shards": 3}}}
    sharded = Queue("byhand-sh")
    assert isinstance(sharded, ShardedQueue)
    jobs = Jobs(kind, "default")
    again = []
    for n in range(3):  # three sources: copies land in more than one partition
        sharded.enqueue(f"src-{n}", {"n": n})
    for part in sharded.partition_names:
        for claimed in jobs.storage.claim(part, "w-1", 10, 30_000).jobs:
            jobs.storage.complete(part, claimed.job_id, claimed.token, b"1")
    jobs.sync(*sharded.partition_names)
    for n in range(3):
        source = Job.objects.get(queue__startswith="byhand-sh~", job_id=f"src-{n}")
        response = admin_client.post(reverse("admin:django_jobq_job_again", args=[source.pk]))
        again.append(new_job_id(response))
        assert response["Location"].startswith(reverse("admin:django_jobq_job_byhand_created"))
        assert "queue=byhand-sh&" in response["Location"]  # the logical queue's name
    for job_id in again:
        home = sharded.partition_names[route(job_id, 3)]
        assert Queue(home).get_status(job_id).state is JobState.QUEUED
        assert sharded.get_status(job_id).queue == "byhand-sh"
    jobs.sync(*sharded.partition_names)
    landing = admin_client.get(reverse("admin:django_jobq_job_byhand_created"),
                               {"queue": "byhand-sh", "id": again[0]})  # fmt: skip
    row = Job.objects.get(job_id=again[0])
    assert row.queue == sharded.partition_names[route(again[0], 3)]
    assert landing["Location"] == reverse("admin:django_jobq_job_change", args=[row.pk])


# -- reschedule and promote all delayed ---------------------------------------------------------


def local(when: dt.datetime) -> str:
    return timezone.localtime(when).strftime(LOCAL_FORMAT)


def test_reschedule_moves_a_delayed_job_and_a_past_time_runs_it_now(admin_client, jobs):
    source = jobs.make("later", "scheduled")
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[source.pk]))
    assert b'id="jobq-reschedule-form"' in page.content
    url = reverse("admin:django_jobq_job_reschedule", args=[source.pk])
    target = (timezone.now() + dt.timedelta(days=3)).replace(microsecond=0)
    done = admin_client.post(url, {"run_at": local(target)}, follow=True)
    assert b"Reschedule to" in done.content and b"done" in done.content
    status = jobs.status("later")
    assert status.state is JobState.SCHEDULED and status.run_at == target
    admin_client.post(url, {"run_at": local(timezone.now() - dt.timedelta(days=1))})
    assert jobs.status("later").state is JobState.QUEUED  # past: runs now
    history = LogEntry.objects.filter(object_id=str(source.pk), action_flag=CHANGE)
    assert [e.change_message.split(":")[0] for e in history.order_by("pk")] == [
        f"Reschedule to {timezone.localtime(target):%Y-%m-%d %H}",
        "Reschedule to now",
    ]


def test_reschedule_of_a_finished_job_says_why_not(admin_client, jobs):
    source = jobs.make("done", "completed")
    url = reverse("admin:django_jobq_job_reschedule", args=[source.pk])
    future = local(timezone.now() + dt.timedelta(hours=1))
    response = admin_client.post(url, {"run_at": future}, follow=True)
    assert b"completed" in response.content and jobs.status("done").state is JobState.COMPLETED


def run_token(page) -> str:
    match = re.search(r'name="run" value="([^"]+)"', page.content.decode())
    assert match, page.content.decode()[:2000]
    return match.group(1)


def test_promote_all_delayed_confirms_with_the_count_then_goes_on_in_chunks(
    admin_client, jobs, monkeypatch
):
    monkeypatch.setattr(filtered, "CHUNK", 2)
    monkeypatch.setattr(filtered, "TIME_BUDGET", 0)  # one job per request
    for n in range(4):
        jobs.make(f"later-{n}", "scheduled")
    jobs.make("now", "queued")
    Queue(Q).enqueue("parked", 1, run_at=dt.datetime(9100, 1, 1, tzinfo=dt.UTC))  # a flow parent
    jobs.make("other", "scheduled", queue="byhand-b")
    jobs.sync(Q, "byhand-b")
    url = reverse("admin:django_jobq_job_promote_all", args=[Q])
    page = admin_client.get(url)
    assert page.status_code == 200 and page.context["run"].total == 4
    assert "<strong>4</strong> delayed jobs" in page.content.decode()
    assert jobs.status("later-0").state is JobState.SCHEDULED  # asking changes nothing
    requests = 0
    while True:
        page = admin_client.post(url, {"run": run_token(page), "confirm": "yes"})
        requests += 1
        run = page.context["run"]
        if run.finished:
            break
        assert 'data-jobq-autosubmit="1"' in page.content.decode() and requests < 20
    assert requests >= 4 and dict(run.counts) == {"runs now": 4}
    assert {jobs.status(f"later-{n}").state for n in range(4)} == {JobState.QUEUED}
    assert jobs.status("parked").state is JobState.SCHEDULED
    assert Queue("byhand-b").get_status("other").state is JobState.SCHEDULED
    assert LogEntry.objects.filter(change_message="Promote all delayed: runs now").count() == 4


def test_a_damaged_promote_run_is_refused(admin_client, jobs):
    jobs.make("later", "scheduled")
    url = reverse("admin:django_jobq_job_promote_all", args=[Q])
    token = run_token(admin_client.get(url))
    assert admin_client.post(url, {"run": token[:-2] + "xx", "confirm": "yes"}).status_code == 400
    other = reverse("admin:django_jobq_job_promote_all", args=["byhand-b"])
    Queue("byhand-b").enqueue("x", 1)
    assert admin_client.post(other, {"run": token, "confirm": "yes"}).status_code == 400
    assert admin_client.get(reverse("admin:django_jobq_job_promote_all",
                                    args=["nope"])).status_code == 404  # fmt: skip
    assert jobs.status("later").state is JobState.SCHEDULED


# -- permissions and CSRF -----------------------------------------------------------------------


def test_each_view_asks_its_permission_and_keeps_csrf(client, jobs):
    done = jobs.make("done", "completed")
    later = jobs.make("later", "scheduled")
    viewer = staff("viewer", "view_job", "view_queueconfig")
    client.force_login(viewer)
    listed = client.get(reverse("admin:django_jobq_job_changelist")).content
    assert b'id="jobq-add-job"' not in listed
    page = client.get(reverse("admin:django_jobq_job_change", args=[done.pk])).content
    assert b"jobq-run-again" not in page and b"jobq-duplicate" not in page
    for url, method in (
        (reverse(ADD), "get"), (reverse(ADD), "post"),
        (reverse("admin:django_jobq_job_duplicate", args=[done.pk]), "get"),
        (reverse("admin:django_jobq_job_again", args=[done.pk]), "post"),
        (reverse("admin:django_jobq_job_reschedule", args=[later.pk]), "post"),
        (reverse("admin:django_jobq_job_promote_all", args=[Q]), "get"),
    ):  # fmt: skip
        assert getattr(client, method)(url).status_code == 403, url
    enqueuer = staff("enqueuer", "view_job", "add_job")
    client.force_login(enqueuer)
    assert b'id="jobq-add-job"' in client.get(reverse("admin:django_jobq_job_changelist")).content
    reschedule = reverse("admin:django_jobq_job_reschedule", args=[later.pk])
    assert client.post(reschedule, {"run_at": "2030-01-01T00:00"}).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(enqueuer)
    assert strict.post(reverse("admin:django_jobq_job_again", args=[done.pk])).status_code == 403
    assert strict.post(reverse(ADD), form(payload="1")).status_code == 403
    assert Queue(Q).counts()[JobState.COMPLETED] == 1 and not Queue(Q).counts()[JobState.QUEUED]
    assert jobs.status("later").state is JobState.SCHEDULED


# -- live logs ----------------------------------------------------------------------------------


def test_the_log_box_is_newest_first_and_follows_the_running_job(admin_client, jobs):
    row = jobs.make("talky", "queued")
    [claimed] = jobs.storage.claim(Q, "w-1", 1, 30_000).jobs
    for n in range(3):
        assert jobs.storage.report(Q, "talky", claimed.token, log=f"line {n}")
    jobs.sync()
    page = admin_client.get(reverse("admin:django_jobq_job_change", args=[row.pk])).content
    html = page.decode()
    assert html.index("line 2") < html.index("line 1") < html.index("line 0")
    assert jobs.storage.report(Q, "talky", claimed.token, log="line 3 <b>")
    # No mirror sync: on Redis the box follows the storage, ahead of the row.
    live = admin_client.get(reverse("admin:django_jobq_job_live", args=[row.pk])).json()
    box = live["html"]["jobq-logs-box"]
    assert box.index("line 3 &lt;b&gt;") < box.index("line 2") and "<b>" not in box
    assert not live["finished"]


# -- hostile input ------------------------------------------------------------------------------

serial = itertools.count()
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


@pytest.mark.parametrize("jobs", [("database", "default"),
                                  pytest.param(("database", "pg"), marks=pytest.mark.postgres)],
                         indirect=True, ids=["sqlite", "postgres"])  # fmt: skip
@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    payload=st.one_of(TEXT, st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=8).map(lambda v: json.dumps(v, allow_nan=True))),
    job_id=st.one_of(st.just(""), TEXT, st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}",
                                                      fullmatch=True)),
    queue=st.one_of(st.just(Q), TEXT),
    run_at=st.one_of(st.just(""), TEXT, st.datetimes().map(lambda d: d.strftime(LOCAL_FORMAT))),
    priority=st.one_of(st.just(""), TEXT, st.integers().map(str)),
)  # fmt: skip
def test_hostile_form_input_is_an_error_or_a_job_never_a_500(
    admin_client, jobs, payload, job_id, queue, run_at, priority
):
    n = next(serial)
    Queue(Q)._register()
    if job_id.isalnum():
        job_id = f"{job_id}-{n}"  # fresh each example: an existing id is its own test
    before = Job.objects.using(jobs_alias()).count()
    response = admin_client.post(reverse(ADD), form(
        queue=queue, payload=payload, job_id=job_id, run_at=run_at, priority=priority,
    ))  # fmt: skip
    assert response.status_code in (200, 302), response.status_code
    added = Job.objects.using(jobs_alias()).count() - before
    if response.status_code == 200:
        assert response.context["form"].errors and added == 0
    else:
        assert added == 1


@pytest.mark.parametrize("jobs", [("database", "default"),
                                  pytest.param(("database", "pg"), marks=pytest.mark.postgres)],
                         indirect=True, ids=["sqlite", "postgres"])  # fmt: skip
@hsettings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(run_at=st.one_of(TEXT, st.datetimes().map(lambda d: d.strftime(LOCAL_FORMAT)),
                        st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M"))))  # fmt: skip
def test_hostile_reschedule_times_are_an_error_or_a_due_time_never_a_500(
    admin_client, jobs, run_at
):
    job_id = f"later-{next(serial)}"
    source = jobs.make(job_id, "scheduled")
    response = admin_client.post(
        reverse("admin:django_jobq_job_reschedule", args=[source.pk]), {"run_at": run_at}
    )
    assert response.status_code == 302
    assert jobs.status(job_id).state in (JobState.SCHEDULED, JobState.QUEUED)
