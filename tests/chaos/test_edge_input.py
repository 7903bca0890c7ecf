"""Faults 10 and 11: hostile input at the edge, and one id enqueued concurrently many times."""

from __future__ import annotations

import json
import re
import threading
import unicodedata

import pytest
from rest_framework.test import APIClient

from django_jobq.api.keys import create_key
from django_jobq.backend import reset_storage
from django_jobq.errors import ValidationError as JobQValidationError
from django_jobq.storage.redis.keys import QueueKeys

from .conftest import events_of

NFC = unicodedata.normalize("NFC", "caf\u00e9")
NFD = unicodedata.normalize("NFD", "caf\u00e9")
FUZZED_IDS = [
    ":", "{", "}", "*", "?", "\n", "\0", "a:b", "{x}", "job*", "job?", "a\nb", "a\0b", "a b",
    "\u200f", "abc\u200f", "\u202eevil", NFC, NFD, "x" * 129, "x" * 1_000_000, "", " ", ".x",
    "-x", "../etc", "a\\b", "[a]", "\ud800", None, ["a"], {"a": 1},
]  # fmt: skip
FUZZED_PATH_PARTS = [":", "{x}", "*", "%3F", "%0A", "%00", "%E2%80%8F", "caf%C3%A9",
                     "cafe%CC%81", "x" * 200, "%7B%7D"]  # fmt: skip
ID = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
QUEUE = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}"


def allowlist(prefix: str) -> re.Pattern[bytes]:
    """Every key shape of keys.py, with names and ids in the validated charset."""
    p = re.escape(prefix)
    shapes = [
        rf"\{{{p}:{QUEUE}\}}:(queued|scheduled|active|wake|seq|events|stats|dead|blocked"
        r"|config|rate|capped)",
        rf"\{{{p}:{QUEUE}\}}:(job|done|succ|dedup|grate|wake):{ID}",
        rf"\{{{p}\}}:(queues|workers)",
        rf"\{{{p}\}}:worker:{ID}",
    ]
    return re.compile(("^(" + "|".join(shapes) + ")$").encode())


def api_client() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Api-Key " + create_key(
        "chaos", queues=["*"], actions=["enqueue", "read", "manage"])[1])  # fmt: skip
    return client


@pytest.mark.django_db(transaction=True)
def test_hostile_input_is_refused_at_the_edge_and_leaves_no_stray_key(
    private_redis, queue_of, prefix, settings, report
):
    server = private_redis()
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": server.url,
                     "PREFIX": prefix}  # fmt: skip
    api = api_client()
    queue = queue_of("chaos-edge", server.url)
    url = "/jobq/queues/chaos-edge/jobs/"
    answers: list[tuple[str, int]] = []

    def post(label: str, data, content_type: str = "application/json") -> int:
        status = api.post(url, data, content_type=content_type).status_code
        answers.append((label, status))
        return status

    for job_id in FUZZED_IDS:
        body = json.dumps({"id": job_id, "payload": {}})
        assert post(f"id {job_id!r:.40}", body) == 400, job_id
        if job_id is not None:  # None asks the Queue API for a generated id
            with pytest.raises(JobQValidationError):
                queue.enqueue(job_id, {})
        for option in ("group", "dedup_key"):
            body = json.dumps({"id": "ok-id", "payload": {}, option: job_id})
            assert post(f"{option} {job_id!r:.40}", body) == 400, (option, job_id)
    for body in ["{", '{"id": ', "nul", "[1,", '{"id": "a"', "\xff\xfe", "{}}", '"\\ud800"',
                 '{"payload": NaN}', '{"payload": 1e999999}',
                 '{"id": "deep", "payload": ' + "[" * 100_000 + "]" * 100_000 + "}"]:  # fmt: skip
        assert post(f"body {body[:20]!r}", body.encode("utf-8", "surrogatepass")) == 400, body[:40]
    assert post("lone surrogate", b'{"id": "sur", "payload": "\\ud800"}') in (201, 400)
    assert post("form, bad id", b"id=a%3Ab", "application/x-www-form-urlencoded") == 400
    assert post("unknown type", b"id: x", "application/yaml") == 415
    big = json.dumps({"id": "big", "payload": "x" * (2 * 1024 * 1024)})
    assert post("2 MiB payload", big) == 413
    huge = b'{"id": "huge", "payload": "' + b"x" * (12 * 1024 * 1024) + b'"}'
    assert post("12 MiB body", huge) == 413
    with pytest.raises(JobQValidationError):
        queue.enqueue(123, {})  # type: ignore[arg-type]  (JSON's 123 the API reads as "123")
    bulk = json.dumps({"jobs": [{"id": "ok-1"}, {"id": "bad:id"}]})
    assert api.post("/jobq/queues/chaos-edge/bulk/", bulk, content_type="application/json"
                    ).status_code == 400  # fmt: skip
    for part in FUZZED_PATH_PARTS:
        for path in (f"/jobq/queues/chaos-edge/jobs/{part}/", f"/jobq/queues/{part}/jobs/x/",
                     f"/jobq/queues/{part}/jobs/"):  # fmt: skip
            status = api.get(path).status_code
            answers.append((f"GET {path[:50]}", status))
            assert status in (400, 404), path
        status = api.post(f"/jobq/queues/{part}/jobs/", "{}", content_type="application/json")
        assert status.status_code in (400, 404), part

    # What is allowed goes through, under the allowlisted key shapes only.
    for job_id in ("ok-1", "ok.2", "OK_3", "9-lives"):
        assert post(f"valid {job_id}", json.dumps({"id": job_id, "payload": {"s": NFD}})) == 201
    queue.enqueue("grouped", {}, group="g-1", dedup_key="d.1")
    pattern = allowlist(prefix)
    keys = list(server.client.scan_iter(count=1000))
    stray = [k for k in keys if not pattern.match(k)]
    report(
        fault="10. oversized bodies, malformed JSON, fuzzed ids and names",
        load=f"{len(answers)} hostile requests + direct Queue calls",
        lost=0, duplicated=0,
        recovery=f"answers {sorted({s for _, s in answers})}; {len(keys)} keys after, "
        f"{len(stray)} outside the allowlist",
    )  # fmt: skip
    assert not [a for a in answers if a[1] >= 500]
    assert stray == []
    assert {e.job_id for e in events_of(queue, "queued")} >= {"ok-1", "ok.2", "OK_3", "9-lives"}
    reset_storage()


@pytest.mark.django_db(transaction=True)
def test_one_id_enqueued_1000_times_from_8_threads_and_the_api_is_one_job(
    queue_of, prefix, settings, report
):
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": prefix}
    queue = queue_of("chaos-dedup")
    clients = [api_client() for _ in range(4)]
    start = threading.Barrier(12)
    outcomes: list[str] = []
    lock = threading.Lock()

    def from_queue(i: int) -> None:
        start.wait()
        for k in range(125):
            result = queue.enqueue("the-one", {"thread": i, "k": k})
            with lock:
                outcomes.append(result.outcome.value)

    def from_api(client: APIClient, i: int) -> None:
        start.wait()
        for k in range(50):
            response = client.post("/jobq/queues/chaos-dedup/jobs/",
                                   {"id": "the-one", "payload": {"api": i, "k": k}},
                                   format="json")  # fmt: skip
            with lock:
                outcomes.append(str(response.status_code) + response.json()["outcome"])

    threads = [threading.Thread(target=from_queue, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=from_api, args=(c, i)) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    keys = QueueKeys.for_queue(prefix, "chaos-dedup")
    client = queue.storage.client
    created = [o for o in outcomes if o in ("queued", "201queued")]
    report(
        fault="11. one id enqueued 1,000 × from 8 threads + 200 × through the API",
        load="1,200 concurrent enqueues of one id",
        lost=0, duplicated=len(created) - 1,
        recovery=f"{len(created)} created, {len(outcomes) - len(created)} duplicates reported",
    )  # fmt: skip
    assert len(outcomes) == 1200
    assert len(created) == 1
    assert set(outcomes) - set(created) <= {"duplicate", "200duplicate"}
    assert client.zrange(keys.queued, 0, -1) == [b"the-one"]
    assert [e.job_id for e in events_of(queue, "queued")] == ["the-one"]
    assert [k for k in client.scan_iter(match=keys.everything[:-1] + "job:*")] == [
        keys.job("the-one").encode()
    ]
    reset_storage()
