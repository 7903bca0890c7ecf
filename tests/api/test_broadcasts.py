"""Broadcast endpoints: publish (deduplicated by id) and per-group status, scoped by API key."""

from __future__ import annotations

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
