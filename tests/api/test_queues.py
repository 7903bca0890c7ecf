"""Queues with counts and stats, pause/resume, workers, schedules."""

from __future__ import annotations

from django_jobq.models import Schedule
from django_jobq.queue import get_queue

from ..helpers import wait_until
from .conftest import registered_workers


def test_queue_list_has_counts_paused_limits_and_stats(api, worker, mirror_now):
    get_queue("tests-echo").enqueue("q1")
    worker("tests-echo")
    get_queue("tests-echo").enqueue_and_wait("q2", 1, timeout=30)
    get_queue("tests-echo").enqueue("later", delay=60_000)
    mirror_now()
    queues = {q["name"]: q for q in api.get("/jobq/queues/").json()}
    echo = queues["tests-echo"]
    assert echo["paused"] is False
    assert echo["counts"]["scheduled"] == 1
    assert echo["counts"]["completed"] >= 1
    assert echo["limits"]["concurrency"] is None
    assert echo["stats"]["completed_last_hour"] >= 1
    assert echo["stats"]["mean_run_seconds"] >= 0


def test_queue_detail_and_unknown_queue(api):
    get_queue("api-a").enqueue("x")
    body = api.get("/jobq/queues/api-a/").json()
    assert (body["name"], body["counts"]["queued"]) == ("api-a", 1)
    assert api.get("/jobq/queues/never-seen/").status_code == 404


def test_pause_and_resume(api):
    get_queue("api-a").enqueue("x")
    response = api.post("/jobq/queues/api-a/pause/")
    assert response.json() == {"name": "api-a", "paused": True}
    assert get_queue("api-a").is_paused()
    assert api.get("/jobq/queues/api-a/").json()["paused"] is True
    assert api.post("/jobq/queues/api-a/resume/").json()["paused"] is False
    assert not get_queue("api-a").is_paused()


def test_workers_lists_live_workers(api, worker):
    w = worker("tests-echo")
    assert wait_until(lambda: w.worker_id in registered_workers(), 30)
    workers = api.get("/jobq/workers/").json()
    assert [x["id"] for x in workers] == [w.worker_id]
    assert workers[0]["queues"] == ["tests-echo"]


def test_workers_of_other_queues_are_hidden_from_a_scoped_key(api_backend, worker, client_for):
    w = worker("tests-echo")
    assert wait_until(lambda: w.worker_id in registered_workers(), 30)
    assert [x["id"] for x in client_for().get("/jobq/workers/").json()] == [w.worker_id]
    assert client_for(queues=["api-a"]).get("/jobq/workers/").json() == []


def test_schedules_are_listed_by_scope(api_backend, client_for):
    Schedule.objects.create(name="nightly", queue="api-a", cron="0 3 * * *")
    Schedule.objects.create(name="often", queue="api-b", interval=60)
    everything = client_for().get("/jobq/schedules/").json()
    assert [s["name"] for s in everything] == ["nightly", "often"]
    assert everything[0]["next_run_at"] is not None
    scoped = client_for(queues=["api-b"]).get("/jobq/schedules/").json()
    assert [s["name"] for s in scoped] == ["often"]


def test_schedule_run_now_enqueues_one_extra_run(api_backend, client_for):
    Schedule.objects.create(name="nightly", queue="api-a", cron="0 3 * * *")
    response = client_for().post("/jobq/schedules/nightly/run/")
    assert response.status_code == 200
    body = response.json()
    assert (body["queue"], body["outcome"]) == ("api-a", "queued")
    assert body["id"].startswith("schedule.nightly.manual-")
    assert get_queue("api-a").get_status(body["id"]).state == "queued"


def test_schedule_run_needs_manage_and_the_queue(api_backend, client_for):
    Schedule.objects.create(name="nightly", queue="api-a", cron="0 3 * * *")
    assert client_for(actions=["read"]).post("/jobq/schedules/nightly/run/").status_code == 403
    assert client_for(queues=["api-b"]).post("/jobq/schedules/nightly/run/").status_code == 404
    assert client_for().post("/jobq/schedules/nope/run/").status_code == 404
    assert get_queue("api-a").counts()["queued"] == 0


def test_a_schedule_is_created_read_changed_and_deleted(api_backend, client_for):
    api = client_for()
    body = {"name": "reports", "queue": "api-a", "cron": "30 2 * * mon-fri",
            "timezone": "Europe/Berlin", "payload": {"kind": "daily"},
            "job_options": {"priority": -5}}  # fmt: skip
    created = api.post("/jobq/schedules/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["next_run_at"] is not None
    assert api.post("/jobq/schedules/", body, format="json").status_code == 409
    assert api.get("/jobq/schedules/reports/").json()["timezone"] == "Europe/Berlin"
    changed = api.patch("/jobq/schedules/reports/", {"interval": 600, "enabled": False},
                        format="json")  # fmt: skip
    assert changed.status_code == 200, changed.json()
    row = Schedule.objects.get(name="reports")
    assert (row.interval, row.cron, row.enabled) == (600, "", False)
    assert api.delete("/jobq/schedules/reports/").status_code == 204
    assert not Schedule.objects.filter(name="reports").exists()
    assert api.get("/jobq/schedules/reports/").status_code == 404


def test_bad_schedules_are_refused_with_field_messages(api_backend, client_for):
    api = client_for()
    bad_cron = api.post("/jobq/schedules/", {"name": "x", "queue": "api-a", "cron": "61 * * * *"},
                        format="json")  # fmt: skip
    assert bad_cron.status_code == 400 and "cron" in bad_cron.json()
    bad_zone = api.post("/jobq/schedules/", {"name": "y", "queue": "api-a", "interval": 5,
                                             "timezone": "Mars/Base"}, format="json")  # fmt: skip
    assert bad_zone.status_code == 400 and "timezone" in bad_zone.json()
    neither = api.post("/jobq/schedules/", {"name": "z", "queue": "api-a"}, format="json")
    assert neither.status_code == 400
    assert api.post("/jobq/schedules/", {"name": "../x", "queue": "api-a", "interval": 5},
                    format="json").status_code == 400  # fmt: skip
    assert not Schedule.objects.exists()


def test_editing_schedules_needs_manage_on_their_queue(api_backend, client_for):
    Schedule.objects.create(name="nightly", queue="api-a", cron="0 3 * * *")
    body = {"name": "n2", "queue": "api-a", "interval": 60}
    assert client_for(actions=["read"]).post("/jobq/schedules/", body,
                                             format="json").status_code == 403  # fmt: skip
    assert client_for(queues=["api-b"]).post("/jobq/schedules/", body,
                                             format="json").status_code == 403  # fmt: skip
    other = client_for(queues=["api-b"])
    assert other.patch("/jobq/schedules/nightly/", {"enabled": False},
                       format="json").status_code == 404  # fmt: skip
    assert other.delete("/jobq/schedules/nightly/").status_code == 404
    assert client_for(actions=["read"]).delete("/jobq/schedules/nightly/").status_code == 403
    assert Schedule.objects.get(name="nightly").enabled


def test_the_queue_list_comes_in_pages_that_link_to_the_next(api):
    """Issue 36: the list was unpaginated (16.8 s at 3,000 queues, no answer at 10,000)."""
    names = [f"paged-{i:02}" for i in range(7)]
    for name in names:
        get_queue(name).enqueue("x")
    seen: list[str] = []
    url = "/jobq/queues/?limit=3"
    pages = 0
    while url:
        response = api.get(url)
        assert response.status_code == 200
        page = [q["name"] for q in response.json()]
        assert len(page) <= 3 and page == sorted(page)
        seen += page
        total = int(response["X-Total-Count"])
        link = response.get("Link")
        url = link[link.index("/jobq/") : link.index(">")] if link else ""
        pages += 1
    assert pages >= 3 and len(seen) == total == len(set(seen))
    assert [n for n in seen if n.startswith("paged-")] == names
    assert api.get("/jobq/queues/?limit=0").status_code == 400
    assert api.get("/jobq/queues/?limit=501").status_code == 400
