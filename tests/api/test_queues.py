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


def test_queue_stats_come_from_the_rollup_the_admin_reads_in_one_read_for_the_page(api, mirror_now):
    """Issue 37, defect 5: each queue's stats were an aggregate over its job rows (1.3–3.6 s
    for 20 queues on a million rows). Now the page reads the admin's per-minute rollup plus
    the rows not folded yet: a few reads of finished rows for the page, not one per queue,
    and the same figures as the admin's overview."""
    import datetime as dt

    from django.db import connections
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from django_jobq.api.listing import rows_alias
    from django_jobq.backend import get_storage
    from django_jobq.mirror import rollup

    storage = get_storage()
    for n in range(12):
        name = f"api-stats-{n}"
        for i in range(n % 4 + 1):
            get_queue(name).enqueue(f"j{i}", i, max_attempts=1)
        for i, claimed in enumerate(storage.claim(name, "w-1", 10, 30_000).jobs):
            if i % 2:
                storage.fail(name, claimed.job_id, claimed.token, b'{"type": "E"}', permanent=True)
            else:
                storage.complete(name, claimed.job_id, claimed.token, b"1")
    mirror_now()

    def finished_reads(path: str) -> tuple[list, list[str]]:
        """The page's reads of finished job rows (the storage's own counts aside)."""
        with CaptureQueriesContext(connections[rows_alias()]) as captured:
            body = api.get(path).json()
        sql = [q["sql"] for q in captured.captured_queries]
        return body, [q for q in sql if '"django_jobq_job"' in q and '"finished_at"' in q]

    many, reads = finished_reads("/jobq/queues/?limit=500")
    assert len(reads) <= 3, reads  # the fold's probe and read, the tail; not one per queue
    admin = rollup.finished_since(rows_alias(), timezone.now() - dt.timedelta(hours=1))
    stats = {q["name"]: q["stats"] for q in many if q["name"].startswith("api-stats-")}
    assert len(stats) == 12
    for name, got in stats.items():
        n = int(name.rsplit("-", 1)[1]) % 4 + 1
        assert (got["completed_last_hour"], got["failed_last_hour"]) == ((n + 1) // 2, n // 2)
        assert (admin[name].completed, admin[name].failed) == ((n + 1) // 2, n // 2)
        assert got["mean_run_seconds"] >= 0 and got["mean_wait_seconds"] >= 0
