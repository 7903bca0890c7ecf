"""``GET /jobq/queues/<queue>/events/`` over real HTTP: the dev server (``runserver``, WSGI) and
an ASGI server (uvicorn) in their own processes, on Redis and on the database backend (SQLite).

The stream is read off the socket as a client would: events arrive as SSE messages with their
ids, new events arrive while the stream is open, heartbeats come while it is idle, the stream
ends cleanly at its timeout, a client resumes with ``Last-Event-ID`` or ``?since=``, ``kinds``
filters, and a key without the queue in its scope is refused before anything is streamed.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

from django_jobq.api.keys import create_key
from django_jobq.backend import get_storage, reset_storage
from django_jobq.queue import Queue

from ..helpers import Spawner, start_server, wait_until

pytestmark = pytest.mark.slow
QUEUE = "tests-sse"


class Stream:
    """One SSE request read line by line off the socket."""

    def __init__(self, port: int, path: str, key: str | None, **headers: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        if key is not None:
            headers["Authorization"] = f"Api-Key {key}"
        self.conn.request("GET", path, headers={"Accept": "text/event-stream", **headers})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def messages(self) -> Iterator[dict[str, str]]:
        """Each message as its fields; a comment is {"comment": text}; ends at end of stream."""
        fields: dict[str, str] = {}
        while True:
            raw = self.response.readline()
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if fields:
                    yield fields
                fields = {}
            elif line.startswith(":"):
                yield {"comment": line[1:].strip()}
            else:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(params=["redis", "sqlite"])
def backend(request, settings, redis_prefix):
    """JOBQ on the backend, here and (through the env) in the server process."""
    env = {"JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"])}
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix}
        env["JOBQ_TEST_PREFIX"] = redis_prefix
    else:
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
        env.update(JOBQ_TEST_BACKEND="database", JOBQ_TEST_DB_ALIAS="default")
    reset_storage()
    yield env
    get_storage().close()
    reset_storage()


@contextmanager
def serving(kind: str, env: dict[str, str], tmp_path) -> Iterator[int]:
    """A real server process (``runserver`` or uvicorn) on the test settings' URLs; its port,
    once that process itself listens there (not merely something answering on it)."""
    spawn = Spawner(tmp_path, env)

    def start(port: int):
        if kind == "runserver":
            return spawn("runserver", f"127.0.0.1:{port}", "--noreload", log="runserver")
        argv = [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--port", str(port),
                "--log-level", "warning"]  # fmt: skip
        spawn.argv = lambda args: list(args)  # type: ignore[method-assign]
        return spawn(*argv, log="uvicorn")

    try:
        yield start_server(start, kind)[1]
    finally:
        spawn.stop_all()


@pytest.fixture(params=["runserver", "uvicorn"])
def server(request, backend, tmp_path) -> Iterator[int]:
    with serving(request.param, backend, tmp_path) as port:
        yield port


def events_until(stream: Stream, predicate, seen: list[dict[str, str]]) -> bool:
    """Read messages into ``seen`` until ``predicate(seen)``; False if the stream ended first."""
    for msg in stream.messages():
        seen.append(msg)
        if predicate(seen):
            return True
    return False


def queued(seen: list[dict[str, str]]) -> list[dict[str, str]]:
    return [m for m in seen if m.get("event")]


def test_stream_follows_resumes_filters_and_ends_cleanly(server, backend):
    key = create_key("sse", queues=(QUEUE,), actions=("read",))[1]
    q = Queue(QUEUE)
    for i in range(3):
        q.enqueue(f"s{i}", {"i": i})
    path = f"/jobq/queues/{QUEUE}/events/?heartbeat=0.2&timeout=120"

    stream = Stream(server, path, key)
    assert stream.status == 200
    assert stream.response.getheader("Content-Type", "").startswith("text/event-stream")
    seen: list[dict[str, str]] = []
    try:
        assert events_until(stream, lambda s: len(queued(s)) == 3, seen)
        first = queued(seen)
        assert [json.loads(m["data"])["job_id"] for m in first] == ["s0", "s1", "s2"]
        assert {m["event"] for m in first} == {"queued"}
        assert all(m["id"] == json.loads(m["data"])["id"] for m in first)
        assert seen[0] == {"retry": "1000"}
        # Idle: heartbeats come; an event enqueued now arrives on the open stream.
        assert events_until(stream, lambda s: s[-1].get("comment") == "keep-alive", seen)
        q.enqueue("s3", {"i": 3})
        assert events_until(stream, lambda s: len(queued(s)) == 4, seen)
        assert json.loads(queued(seen)[-1]["data"])["job_id"] == "s3"
    finally:
        stream.close()
    ids = [m["id"] for m in queued(seen)]

    # Resume after the second event, by the header a browser resends and by ?since=.
    for resume, headers in (("", {"Last-Event-ID": ids[1]}), (f"&since={ids[1]}", {})):
        again = Stream(server, path + resume, key, **headers)
        got: list[dict[str, str]] = []
        try:
            assert events_until(again, lambda s: len(queued(s)) == 2, got)
        finally:
            again.close()
        assert [m["id"] for m in queued(got)] == ids[2:]

    # kinds: only cancellations; a short timeout: the stream ends by itself, cleanly, and its
    # last message moves the client's last id past the events the filter skipped.
    assert q.cancel("s1") == "cancelled"
    short = Stream(server, f"/jobq/queues/{QUEUE}/events/?kinds=cancelled&timeout=1", key)
    got = list(short.messages())  # to the end of the stream: it closes by itself
    short.close()
    kept = queued(got)
    assert [(m["event"], json.loads(m["data"])["job_id"]) for m in kept] == [("cancelled", "s1")]
    assert got[-2] == {"id": kept[-1]["id"]} and got[-1]["comment"].startswith("timeout")


def test_stream_refuses_keys_out_of_scope_and_bad_parameters(server, backend):
    other = create_key("sse-other", queues=("tests-other",), actions=("read",))[1]
    enqueue_only = create_key("sse-enq", queues=(QUEUE,), actions=("enqueue",))[1]
    reader = create_key("sse-reader", queues=(QUEUE,), actions=("read",))[1]
    Queue(QUEUE).enqueue("secret", {"card": "4111"})
    path = f"/jobq/queues/{QUEUE}/events/?timeout=5"
    for key, status in ((None, 401), (other, 403), (enqueue_only, 403)):
        refused = Stream(server, path, key)
        try:
            body = refused.response.read().decode()
        finally:
            refused.close()
        assert refused.status == status, body
        assert "secret" not in body and "event: error" in body
    for query, word in (("kinds=finished", "kinds"), ("since=abc", "since"),
                        ("timeout=0", "timeout"), ("heartbeat=999", "heartbeat")):  # fmt: skip
        bad = Stream(server, f"/jobq/queues/{QUEUE}/events/?{query}", reader)
        try:
            body = bad.response.read().decode()
        finally:
            bad.close()
        assert bad.status == 400 and word in body, (query, bad.status, body)


def idle_connections_of_others() -> int:
    """Connections to the PostgreSQL test database, other than this test's, that sit idle;
    not the database backend's LISTEN connection (one per process, shared by all its waits,
    started by its first read: not the stream's)."""
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state LIKE 'idle%%'"
            " AND query NOT LIKE 'LISTEN %%'"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default", "pg"], transaction=True)
@pytest.mark.parametrize("kind", ["runserver", "uvicorn"])
def test_an_idle_stream_holds_no_database_connection(kind, settings, tmp_path):
    """The database backend on PostgreSQL: while a stream is open and idle (heartbeats
    flowing), its polls leave no connection of the server idle on the database. A stream
    that kept its connection between polls would keep one idle for good."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "pg"}
    reset_storage()
    env = {"JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
           "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
           "JOBQ_TEST_BACKEND": "database", "JOBQ_TEST_DB_ALIAS": "pg"}  # fmt: skip
    key = create_key("sse-pg", queues=(QUEUE,), actions=("read",))[1]
    Queue(QUEUE).enqueue("pg1", {})
    try:
        with serving(kind, env, tmp_path) as port:
            stream = Stream(port, f"/jobq/queues/{QUEUE}/events/?heartbeat=0.2&timeout=120", key)
            seen: list[dict[str, str]] = []
            try:
                assert events_until(stream, lambda s: len(queued(s)) == 1, seen)
                beats = lambda s: sum(m.get("comment") == "keep-alive" for m in s) >= 3  # noqa: E731
                assert events_until(stream, beats, seen)  # idle, and still polling
                assert wait_until(lambda: idle_connections_of_others() == 0)
            finally:
                stream.close()
    finally:
        get_storage().close()
        reset_storage()


SHARDED = "tests-sse-sharded"


@pytest.fixture
def sharded_server(request, backend, settings, tmp_path) -> Iterator[int]:
    """A server (``runserver`` and uvicorn) where ``SHARDED`` has three partitions."""
    queues = {SHARDED: {"shards": 3}}
    settings.JOBQ = {**settings.JOBQ, "QUEUES": queues}
    env = {**backend, "JOBQ_TEST_QUEUES": json.dumps(queues)}
    with serving(request.param, env, tmp_path) as port:
        yield port


@pytest.mark.parametrize("sharded_server", ["runserver", "uvicorn"], indirect=True)
def test_a_sharded_queue_streams_its_partitions_merged_and_resumes_by_cursor(sharded_server):
    from ..test_sharding import ids_in

    key = create_key("sse-sharded", queues=(SHARDED,), actions=("read",))[1]
    q = Queue(SHARDED)
    jobs = [ids_in(p, 3, 2, "sh")[0] for p in range(3)]
    for job in jobs:
        q.enqueue(job, {})
    path = f"/jobq/queues/{SHARDED}/events/?heartbeat=0.2&timeout=120"
    stream = Stream(sharded_server, path, key)
    assert stream.status == 200
    seen: list[dict[str, str]] = []
    try:
        assert events_until(stream, lambda s: len(queued(s)) == 3, seen)
        late = ids_in(1, 3, 2, "sh")[1]  # into a partition while the stream waits on all
        q.enqueue(late, {})
        assert events_until(stream, lambda s: len(queued(s)) == 4, seen)
    finally:
        stream.close()
    data = [json.loads(m["data"]) for m in queued(seen)]
    assert sorted(d["job_id"] for d in data) == sorted([*jobs, late])
    assert {d["queue"] for d in data} == {SHARDED}  # the logical name, not a partition's
    ids = [m["id"] for m in queued(seen)]
    assert all(i.startswith("s3:") and i == d["id"] for i, d in zip(ids, data, strict=True))

    for resume, headers in (("", {"Last-Event-ID": ids[1]}), (f"&since={ids[1]}", {})):
        again = Stream(sharded_server, path + resume, key, **headers)
        got: list[dict[str, str]] = []
        try:
            assert events_until(again, lambda s: len(queued(s)) == 2, got)
        finally:
            again.close()
        assert [m["id"] for m in queued(got)] == ids[2:]

    assert q.cancel(jobs[2]) == "cancelled"
    short = Stream(sharded_server, f"/jobq/queues/{SHARDED}/events/?kinds=cancelled&timeout=1",
                   key)  # fmt: skip
    got = list(short.messages())
    short.close()
    kept = queued(got)
    assert [(m["event"], json.loads(m["data"])["job_id"]) for m in kept] == [("cancelled", jobs[2])]
    assert got[-2] == {"id": kept[-1]["id"]} and got[-1]["comment"].startswith("timeout")

    # A cursor of one partition, of another shard count, or malformed: refused, not guessed.
    for bad in ("1700000000000-0", "s2:0,0", "s3:0,0", "s3:0,x,0"):
        for query, headers in ((f"?since={bad}", {}), ("", {"Last-Event-ID": bad})):
            refused = Stream(sharded_server, f"/jobq/queues/{SHARDED}/events/{query}", key,
                             **headers)  # fmt: skip
            try:
                body = refused.response.read().decode()
            finally:
                refused.close()
            assert refused.status == 400 and "since" in body, (bad, refused.status, body)


def test_a_stream_says_lost_events_and_stops_when_its_key_is_revoked(server, backend):
    """Issue 36: a cursor whose events are gone gets a ``lost`` message (then the oldest kept
    events), not a silent jump; a stream whose key is revoked ends with an error message."""
    from django_jobq.api.keys import revoke
    from django_jobq.models import ApiKey

    created, key = create_key("sse-lost", queues=(QUEUE,), actions=("read",))
    q = Queue(QUEUE)
    q.enqueue("old", {})
    q.enqueue("unread", {})  # gone with the queue before the stream read it
    old, _ = q.events()
    q.obliterate(force=True)
    q.enqueue("new", {})
    stream = Stream(server, f"/jobq/queues/{QUEUE}/events/?heartbeat=0.2&timeout=120", key,
                    **{"Last-Event-ID": old.id})  # fmt: skip
    seen: list[dict[str, str]] = []
    try:
        assert events_until(stream, lambda s: len(queued(s)) == 2, seen)
        lost, new = queued(seen)
        assert (lost["event"], lost["id"], json.loads(lost["data"])["since"]) == (
            "lost",
            "0",
            old.id,
        )
        assert json.loads(new["data"])["job_id"] == "new"
        revoke(ApiKey.objects.get(pk=created.pk))
        # The stream ends by itself within a recheck, with an error message as its last.
        rest = list(stream.messages())
    finally:
        stream.close()
    errors = [m for m in rest if m.get("event") == "error"]
    assert errors and "no longer" in json.loads(errors[-1]["data"])["detail"], rest


def test_a_chunked_enqueue_over_a_real_server_is_refused_not_stored_blank(server, backend):
    """Issue 36, as a client sends it: ``Transfer-Encoding: chunked`` through runserver and
    uvicorn was read as an empty body, and the enqueue stored a blank job."""
    key = create_key("chunked", queues=(QUEUE,), actions=("enqueue", "read"))[1]
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=60)
    try:
        body = iter([b'{"id": "mine", ', b'"payload": {"x": 1}}'])
        conn.request("POST", f"/jobq/queues/{QUEUE}/jobs/", body=body, encode_chunked=True,
                     headers={"Authorization": f"Api-Key {key}",
                              "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 411 and "Content-Length" in answer["detail"], answer
    assert Queue(QUEUE).counts().get("queued", 0) == 0
