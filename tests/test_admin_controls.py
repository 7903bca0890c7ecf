"""Queue controls in the admin (django_jobq/admin/controls.py): pause or resume every queue,
edit one queue's limits and retention, each permissioned and in the admin's history, on the
database backend and on Redis with the mirror, a sharded queue included."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_jobq.job import Keep, QueueLimits, Retention
from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue

from .test_admin import jobq, staff  # noqa: F401 - the backend fixture

pytestmark = [
    pytest.mark.django_db(databases=["default"], transaction=True),
    pytest.mark.usefixtures("jobq"),  # each test on the database backend and on Redis
]
NAMES = ("ctl-a", "ctl-b", "ctl-c")


def settings_url(name: str) -> str:
    return reverse("admin:django_jobq_queue_settings", args=[name])


def logged(name: str) -> list[str]:
    return list(
        LogEntry.objects.filter(object_id=name)
        .order_by("pk")
        .values_list("change_message", flat=True)
    )


def test_pause_all_confirms_then_pauses_every_queue_and_resume_all_undoes_it(admin_client):
    for name in NAMES:
        Queue(name).enqueue("j", 1)
    url = reverse("admin:django_jobq_queue_pause_all", args=["pause"])
    page = admin_client.get(url)
    assert page.status_code == 200 and not any(Queue(n).is_paused() for n in NAMES)
    assert "jobq-pause-all-go" in page.content.decode()
    done = admin_client.post(url, {"confirm": "yes"}, follow=True)
    assert all(Queue(n).is_paused() for n in NAMES)
    assert "Paused" in done.content.decode()
    admin_client.post(reverse("admin:django_jobq_queue_pause_all", args=["resume"]),
                      {"confirm": "yes"})  # fmt: skip
    assert not any(Queue(n).is_paused() for n in NAMES)
    assert logged("ctl-a") == ["Paused (all queues)", "Resumed (all queues)"]
    assert (
        admin_client.get(reverse("admin:django_jobq_queue_pause_all", args=["x"])).status_code
        == 404
    )


def test_one_queues_pause_is_in_the_history(admin_client):
    Queue("ctl-a").enqueue("j", 1)
    admin_client.post(reverse("admin:django_jobq_queue_pause", args=["ctl-a", "pause"]))
    assert Queue("ctl-a").is_paused() and logged("ctl-a") == ["Paused"]


def test_a_viewer_can_neither_pause_all_nor_edit_limits():
    Queue("ctl-a").enqueue("j", 1)
    client = Client()
    client.force_login(staff("viewer", "view_queueconfig"))
    url = reverse("admin:django_jobq_queue_pause_all", args=["pause"])
    assert client.get(url).status_code == 403
    assert client.post(url, {"confirm": "yes"}).status_code == 403
    assert client.get(settings_url("ctl-a")).status_code == 403
    assert client.post(settings_url("ctl-a"), {"concurrency": "1"}).status_code == 403
    assert not Queue("ctl-a").is_paused() and Queue("ctl-a").get_limits() == QueueLimits()
    overview = client.get(reverse("admin:django_jobq_queueconfig_changelist")).content.decode()
    assert "jobq-pause-all" not in overview


def test_limits_and_retention_are_edited_from_the_queue_page(admin_client):
    queue = Queue("ctl-a")
    queue.enqueue("j", 1)
    detail = admin_client.get(reverse("admin:django_jobq_queue_detail", args=["ctl-a"]))
    assert settings_url("ctl-a") in detail.content.decode()
    saved = admin_client.post(settings_url("ctl-a"), {
        "concurrency": "4", "rate_max": "100", "rate_window": "60",
        "completed_count": "1000", "failed_age": "604800",
    })  # fmt: skip
    assert saved.status_code == 302
    assert queue.get_limits() == QueueLimits(rate_max=100, rate_window=60_000, concurrency=4)
    assert queue.get_retention() == Retention(
        completed=Keep(count=1000), failed=Keep(age=604_800_000)
    )
    assert logged("ctl-a")[-1].startswith("Limits and retention set: concurrency=4")
    form = admin_client.get(settings_url("ctl-a")).context["form"]
    assert form.initial["rate_window"] == 60 and form.initial["failed_age"] == 604_800
    cleared = admin_client.post(settings_url("ctl-a"), {})
    assert cleared.status_code == 302
    assert queue.get_limits() == QueueLimits() and queue.get_retention().empty


@pytest.mark.parametrize(
    "fields",
    [
        {"rate_max": "10"},  # a rate needs its window
        {"group_rate_window": "5"},
        {"concurrency": "0"},
        {"concurrency": "-3"},
        {"concurrency": "many"},
        {"concurrency": str(2**40)},
        {"completed_count": "1.5"},
        {"failed_age": "0"},
    ],
)
def test_bad_limits_are_refused_on_the_form_and_change_nothing(admin_client, fields):
    queue = Queue("ctl-a")
    queue.set_limits(concurrency=2)
    page = admin_client.post(settings_url("ctl-a"), fields)
    assert page.status_code == 200 and page.context["form"].errors
    assert queue.get_limits() == QueueLimits(concurrency=2) and logged("ctl-a") == []


text = st.one_of(
    st.text(max_size=30), st.integers(-(2**70), 2**70).map(str), st.just(""), st.just("1\x00")
)


@hsettings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.dictionaries(st.sampled_from([
    "concurrency", "rate_max", "rate_window", "group_rate_max", "group_rate_window",
    "completed_count", "completed_age", "failed_count", "cancelled_age",
]), text, max_size=5))  # fmt: skip
def test_any_input_to_the_form_answers_without_an_error(admin_client, fields):
    Queue("ctl-a").enqueue("j", 1)  # known (a second example: the same job, deduplicated)
    page = admin_client.post(settings_url("ctl-a"), fields)
    assert page.status_code in (200, 302)
    if page.status_code == 200:  # refused: nothing was written
        assert page.context["form"].errors or page.context["error"]


def test_unknown_queue_settings_is_a_404(admin_client):
    assert admin_client.get(settings_url("never-seen")).status_code == 404
    assert admin_client.get(settings_url("never-seen") + "../x/").status_code == 404


def test_a_sharded_queues_retention_reaches_every_partition(admin_client, settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"ctl-sharded": {"shards": 3}}}
    queue = Queue("ctl-sharded")
    assert isinstance(queue, ShardedQueue)
    queue.enqueue_many([(f"j{i}", i) for i in range(6)])
    admin_client.post(settings_url("ctl-sharded"), {"completed_count": "30", "concurrency": "6"})
    for part in queue.members():
        assert part.get_retention() == Retention(completed=Keep(count=30))
    assert queue.get_limits().concurrency == 6
