"""The admin's Broadcasts page on the database backend and on Redis: per-group lag, pending,
dead and missed counts from the storage, dead letters, and retry / purge with permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_jobq.broadcast import Broadcast
from django_jobq.storage.broadcast_base import Settle, SettleKind

pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)
NAME = "admin-bc"


@pytest.fixture(params=["database", pytest.param("redis", marks=pytest.mark.redis)])
def bc(request, settings) -> Broadcast:
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": prefix}
    else:
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    return Broadcast(NAME, maxlen=3)


def dead_letter(bc: Broadcast, group: str, message_id: str) -> None:
    store = bc.store
    (d,) = [x for x in store.claim(NAME, group, "w", 10, 30_000, 1) if x.message_id == message_id]
    error = b'{"type": "ValueError", "message": "bad input"}'
    store.settle(NAME, group, [Settle(SettleKind.DEAD, d.position, d.token, error=error)])


def test_the_list_shows_each_groups_lag_pending_dead_and_missed(admin_client, bc):
    bc.subscribe("billing", start="earliest")
    bc.subscribe("search", start="earliest")
    bc.publish_many([("a", 1), ("b", 2)])
    dead_letter(bc, "billing", "a")  # billing: a dead, b active
    bc.publish_many([("c", 3), ("d", 4)])  # maxlen 3 drops a (search never read it)
    page = admin_client.get(reverse("admin:django_jobq_broadcastlog_changelist"))
    assert page.status_code == 200
    (row,) = [b for b in page.context["broadcasts"] if b["name"] == NAME]
    groups = {g.group: g for g in row["groups"]}
    assert (groups["billing"].lag, groups["billing"].pending, groups["billing"].dead) == (2, 1, 1)
    assert (groups["search"].lag, groups["search"].missed) == (3, 1)
    assert b"fell behind" in page.content


def test_a_groups_dead_letters_can_be_retried_by_a_user_who_may_change(admin_client, bc):
    bc.subscribe("billing", start="earliest")
    bc.publish("x", id="a")
    dead_letter(bc, "billing", "a")
    url = reverse("admin:django_jobq_broadcast_group", args=[NAME, "billing"])
    page = admin_client.get(url)
    assert [d["message_id"] for d in page.context["dead"]] == ["a"]
    assert "ValueError: bad input" in page.content.decode()
    retry = reverse("admin:django_jobq_broadcast_dead", args=[NAME, "billing", "retry"])
    assert admin_client.post(retry).status_code == 302
    assert bc.delivery("billing", "a").state == "retrying"


def test_a_view_only_user_sees_the_page_but_cannot_purge(client, bc):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_broadcastlog"))
    client.force_login(user)
    bc.subscribe("billing", start="earliest")
    bc.publish("x", id="a")
    dead_letter(bc, "billing", "a")
    assert client.get(reverse("admin:django_jobq_broadcastlog_changelist")).status_code == 200
    purge = reverse("admin:django_jobq_broadcast_dead", args=[NAME, "billing", "purge"])
    assert client.post(purge).status_code == 403
    assert len(bc.dead_letters("billing")) == 1
    missing = reverse("admin:django_jobq_broadcast_group", args=[NAME, "nobody"])
    assert client.get(missing).status_code == 404


def test_the_workers_page_lists_a_subscriber_worker_with_its_groups(admin_client, bc):
    from django_jobq.broadcast import Subscription
    from django_jobq.broadcast.subscribers import SubscriberWorker

    from .helpers import wait_until

    subs = [Subscription(NAME, g, lambda job: None) for g in ("billing", "search")]
    worker = SubscriberWorker(subs, storage=bc.storage, concurrency=1, lease=30_000, grace=0)
    worker.start()
    url = reverse("admin:django_jobq_workerinfo_changelist")
    try:

        def listed():
            rows = admin_client.get(url).context["workers"]
            return next((w for w in rows if w["worker_id"] == worker.worker_id), None)

        assert wait_until(lambda: listed() is not None, 20)
        row = listed()
        assert row["groups"] == [[NAME, "billing"], [NAME, "search"]] and row["queues"] == []
        html = admin_client.get(url).content.decode()
        group_url = reverse("admin:django_jobq_broadcast_group", args=[NAME, "search"])
        assert f'href="{group_url}">{NAME}:search</a>' in html
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(20)
    assert listed() is None  # deregistered
