"""GET /jobs/: filters and keyset pagination over the rows (mirror on Redis)."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from django_jobq.api.pagination import encode_cursor
from django_jobq.models import Job
from django_jobq.queue import get_queue


def ids(response) -> list[str]:
    return [row["id"] for row in response.json()["results"]]


def test_jobs_newest_first_with_their_fields(api, mirror_now):
    for n in range(3):
        get_queue("api-a").enqueue(f"j{n}", n)
    mirror_now()
    body = api.get("/jobq/jobs/").json()
    assert [r["id"] for r in body["results"]] == ["j2", "j1", "j0"]
    assert body["next"] is None
    row = body["results"][0]
    assert (row["queue"], row["state"], row["attempts"]) == ("api-a", "queued", 0)
    assert "payload" not in row


def test_cursor_pages_cover_every_job_once_and_stay_stable_under_inserts(api, mirror_now):
    for n in range(7):
        get_queue("api-a").enqueue(f"p{n}", n)
    mirror_now()
    first = api.get("/jobq/jobs/?limit=3")
    get_queue("api-a").enqueue("newer", 0)  # arrives while the client pages
    mirror_now()
    second = api.get(first.json()["next"])
    third = api.get(second.json()["next"])
    assert ids(first) + ids(second) + ids(third) == [f"p{n}" for n in range(6, -1, -1)]
    assert third.json()["next"] is None


def test_rows_with_the_same_created_time_page_by_id(api, mirror_now):
    for n in range(4):
        get_queue("api-a").enqueue(f"t{n}", n)
    mirror_now()
    Job.objects.update(created_at=timezone.now())
    first = api.get("/jobq/jobs/?limit=2")
    second = api.get(first.json()["next"])
    assert sorted(ids(first) + ids(second)) == ["t0", "t1", "t2", "t3"]


def test_filters_by_queue_state_handler_and_time(api, mirror_now):
    get_queue("api-a").enqueue("a1")
    get_queue("api-b").enqueue("b1")
    get_queue("api-b").enqueue("b2")
    get_queue("api-b").cancel("b2")
    mirror_now()
    assert ids(api.get("/jobq/jobs/?queue=api-b")) == ["b2", "b1"]
    assert ids(api.get("/jobq/jobs/?queue=api-b&state=cancelled")) == ["b2"]
    assert ids(api.get("/jobq/jobs/?handler=no.such.handler")) == []
    later = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    assert ids(api.get("/jobq/jobs/", {"created_after": later})) == []
    assert len(ids(api.get("/jobq/jobs/", {"created_before": later}))) == 3


def test_filter_by_handler(api, mirror_now):
    get_queue("tests-echo").enqueue("h1")
    get_queue("api-a").enqueue("h2")
    mirror_now()
    handler = Job.objects.get(job_id="h1").handler
    assert handler  # the registered handler of tests-echo
    assert ids(api.get("/jobq/jobs/", {"handler": handler})) == ["h1"]


def test_bad_filters_are_400_naming_the_field(api):
    for query, field in [("state=nope", "state"), ("limit=0", "limit"), ("limit=501", "limit"),
                         ("created_after=yesterday", "created_after"), ("cursor=zzz", "cursor"),
                         ("queue=bad%20name", "queue"),
                         ("cursor=" + encode_cursor(timezone.now(), 2**70), "cursor")]:  # fmt: skip
        response = api.get(f"/jobq/jobs/?{query.replace('+', '%2B')}")
        assert response.status_code == 400, query
        assert field in response.json(), query
