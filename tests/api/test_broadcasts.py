"""Broadcast endpoints: publish (deduplicated by id) and per-group status, scoped by API key."""

from __future__ import annotations

from rest_framework.test import APIClient

from django_jobq.broadcast import Broadcast

NAME = "api-bc"


def test_publish_stores_once_per_id_and_every_group_sees_it(api):
    Broadcast(NAME).subscribe("billing")
    Broadcast(NAME).subscribe("search")
    url = f"/jobq/broadcasts/{NAME}/publish/"
    first = api.post(url, {"id": "u1", "payload": {"user": 1}}, format="json")
    again = api.post(url, {"id": "u1", "payload": {"user": 1}}, format="json")
    assert (first.status_code, first.json()["outcome"]) == (201, "published")
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    assert again.json()["position"] == first.json()["position"]
    groups = {g["group"]: g for g in api.get(f"/jobq/broadcasts/{NAME}/").json()["groups"]}
    assert {g: (s["lag"], s["pending"], s["dead"], s["missed"]) for g, s in groups.items()} == {
        "billing": (1, 0, 0, 0), "search": (1, 0, 0, 0),
    }  # fmt: skip


def test_group_status_and_unknown_names(api):
    Broadcast(NAME).subscribe("billing")
    body = api.get(f"/jobq/broadcasts/{NAME}/groups/billing/").json()
    assert (body["group"], body["lag"], body["position"]) == ("billing", 0, "")
    assert api.get(f"/jobq/broadcasts/{NAME}/groups/nobody/").status_code == 404
    assert api.get("/jobq/broadcasts/never-seen/").status_code == 404
    assert api.post("/jobq/broadcasts/bad name/publish/", {}, format="json").status_code == 404


def test_bad_input_is_a_400_and_stores_nothing(api):
    url = f"/jobq/broadcasts/{NAME}/publish/"
    assert api.post(url, {"id": "no spaces", "payload": 1}, format="json").status_code == 400
    assert Broadcast(NAME).length() == 0


def test_a_key_sees_and_publishes_only_to_its_broadcasts(api_backend, client_for):
    Broadcast(NAME).subscribe("billing")
    Broadcast("other-bc").subscribe("billing")
    scoped = client_for(queues=[NAME], actions=["read", "enqueue"])
    assert [b["name"] for b in scoped.get("/jobq/broadcasts/").json()] == [NAME]
    assert scoped.get("/jobq/broadcasts/other-bc/").status_code == 403
    denied = scoped.post("/jobq/broadcasts/other-bc/publish/", {"payload": 1}, format="json")
    assert denied.status_code == 403
    reader = client_for(queues=["*"], actions=["read"])
    refused = reader.post(f"/jobq/broadcasts/{NAME}/publish/", {"payload": 1}, format="json")
    assert refused.status_code == 403
    assert Broadcast("other-bc").length() == 0 and Broadcast(NAME).length() == 0


# -- dead letters of a group ----------------------------------------------------------------


def _bury(name: str, group: str, *ids: str) -> None:
    """Claim the group's next messages and settle each as dead, as a worker would."""
    from django_jobq.storage.broadcast_base import Settle, SettleKind

    store = Broadcast(name).store
    got = store.claim(name, group, "w", len(ids), 60_000, 1)
    error = b'{"type":"RuntimeError","message":"boom"}'
    store.settle(name, group, [Settle(SettleKind.DEAD, d.position, d.token, error=error)
                               for d in got])  # fmt: skip


def test_dead_letters_are_listed_retried_and_purged_per_group(api):
    bc = Broadcast(NAME)
    bc.subscribe("billing", start="earliest")
    bc.subscribe("search", start="earliest")
    bc.publish_many([("a", {"n": 1}), ("b", {"n": 2}), ("c", {"n": 3})])
    _bury(NAME, "billing", "a", "b", "c")
    dead = f"/jobq/broadcasts/{NAME}/groups/billing/dead/"
    page = api.get(dead, {"limit": 2}).json()
    assert page["count"] == 3 and [d["id"] for d in page["results"]] == ["a", "b"]
    first = page["results"][0]
    assert (first["payload"], first["attempts"], first["error"]["type"]) == (
        {"n": 1}, 1, "RuntimeError",
    )  # fmt: skip
    assert api.get(f"/jobq/broadcasts/{NAME}/groups/search/dead/").json()["count"] == 0
    retried = api.post(dead + "retry/", {"positions": [first["position"]]}, format="json")
    assert retried.json() == {"count": 1}
    assert bc.delivery("billing", "a").state == "retrying"
    assert bc.delivery("search", "a").state == "unread"  # the other group is untouched
    assert api.post(dead + "purge/", format="json").json() == {"count": 2}
    assert api.get(dead).json()["count"] == 0
    assert api.post(dead + "retry/", {}, format="json").json() == {"count": 0}
    assert bc.delivery("billing", "a").state == "retrying"  # purge took only dead letters


def test_dead_letter_endpoints_refuse_bad_input_and_unknown_groups(api):
    bc = Broadcast(NAME)
    bc.subscribe("billing", start="earliest")
    bc.publish(1, id="a")
    _bury(NAME, "billing", "a")
    dead = f"/jobq/broadcasts/{NAME}/groups/billing/dead/"
    for body in ({"positions": ["x"]}, {"positions": "1"}, {"positions": ["1" * 50]},
                 {"positions": ["1"] * 1001}):  # fmt: skip
        assert api.post(dead + "retry/", body, format="json").status_code == 400, body
    assert api.get(dead, {"limit": 0}).status_code == 400
    assert api.get(dead, {"limit": "many"}).status_code == 400
    assert api.post(dead + "retry/", {"positions": ["99-0", "12345"]}, format="json").json() == {
        "count": 0
    }  # positions that are not dead letters of the group move nothing
    nobody = f"/jobq/broadcasts/{NAME}/groups/nobody/dead/"
    assert api.get(nobody).status_code == 404
    assert api.post(nobody + "purge/", format="json").status_code == 404
    assert bc.status()[0].dead == 1  # nothing refused was applied


def test_dead_letter_endpoints_are_scoped_by_api_key(api_backend, client_for):
    for name in (NAME, "other-bc"):
        Broadcast(name).subscribe("billing", start="earliest")
        Broadcast(name).publish(1, id="a")
        _bury(name, "billing", "a")
    mine = f"/jobq/broadcasts/{NAME}/groups/billing/dead/"
    other = "/jobq/broadcasts/other-bc/groups/billing/dead/"
    scoped = client_for(queues=[NAME], actions=["read", "manage"])
    assert scoped.get(mine).json()["count"] == 1
    assert scoped.get(other).status_code == 403
    assert scoped.post(other + "retry/", {}, format="json").status_code == 403
    assert scoped.post(other + "purge/", format="json").status_code == 403
    reader = client_for(queues=["*"], actions=["read"])
    assert reader.get(other).status_code == 200
    assert reader.post(mine + "retry/", {}, format="json").status_code == 403
    assert reader.post(mine + "purge/", format="json").status_code == 403
    assert [s.dead for n in (NAME, "other-bc") for s in Broadcast(n).status()] == [1, 1]
    anonymous = APIClient()
    assert anonymous.get(mine).status_code in (401, 403)


# -- subscriber workers in the workers list -------------------------------------------------


def test_workers_list_subscriber_workers_with_their_groups_by_scope(api_backend, worker,
                                                                   client_for):  # fmt: skip
    """A subscriber worker is listed with its groups and pool. A key scoped to a broadcast
    sees it, with that broadcast's groups only; a key scoped to a queue sees the job worker
    and not the subscriber worker; a key scoped to neither sees neither."""
    from django_jobq.backend import get_storage
    from django_jobq.broadcast import Subscription
    from django_jobq.broadcast.subscribers import SubscriberWorker

    from ..helpers import wait_until
    from .conftest import registered_workers

    subs = SubscriberWorker(
        [Subscription(NAME, "billing", print), Subscription("other-bc", "audit", print)],
        storage=get_storage(), lease=5000, grace=1, concurrency=1,
    )  # fmt: skip
    subs.start()
    try:
        jobs = worker("tests-echo")
        assert wait_until(lambda: {jobs.worker_id, subs.worker_id} <= set(registered_workers()))

        def listed(client) -> dict[str, tuple[list[str], list[str], str]]:
            body = client.get("/jobq/workers/").json()
            return {w["id"]: (w["queues"], w["groups"], w["pool"]) for w in body}

        everything = listed(client_for())
        assert everything[subs.worker_id] == ([], [f"{NAME}:billing", "other-bc:audit"], "thread")
        assert everything[jobs.worker_id][:2] == (["tests-echo"], [])
        assert listed(client_for(queues=[NAME], actions=["read"])) == {
            subs.worker_id: ([], [f"{NAME}:billing"], "thread")
        }
        assert set(listed(client_for(queues=["tests-echo"], actions=["read"]))) == {jobs.worker_id}
        assert listed(client_for(queues=["api-a"], actions=["read"])) == {}
    finally:
        subs.stop(hurry=True)
        assert subs.stopped.wait(20)
