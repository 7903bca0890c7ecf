"""Worker commands from the admin (issue 37, "control"): an operator asks a live worker to stop
gracefully or to change its concurrency; the worker takes the command at its next heartbeat.
The storage half on every backend, the worker half with a real worker, the admin half with
permissions and the history."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from django_jobq.backend import get_storage
from django_jobq.worker import Worker

from .helpers import wait_until
from .test_admin import staff


def test_a_command_is_taken_once_and_the_last_one_counts(storage):
    assert storage.take_worker_command("w-1") is None
    storage.register_worker("w-1", {"host": "h", "queues": ["q"], "concurrency": 4}, 60_000)
    storage.send_worker_command("w-1", {"op": "concurrency", "n": 2})
    storage.send_worker_command("w-1", {"op": "stop"})  # replaces the one not taken yet
    storage.register_worker("w-1", {"host": "h", "queues": ["q"], "concurrency": 4}, 60_000)
    assert storage.take_worker_command("w-1") == {"op": "stop"}  # a heartbeat kept it
    assert storage.take_worker_command("w-1") is None
    assert storage.take_worker_command("w-2") is None


CONTROL = "admin:django_jobq_workerinfo_control"


@pytest.fixture
def running(settings):
    """A real worker on the configured storage with a fast heartbeat."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    worker = Worker(["tests-echo"], concurrency=4, lease=600)  # a heartbeat every 0.2 s
    thread = worker.start()
    assert wait_until(lambda: any(w.worker_id == worker.worker_id
                                  for w in get_storage().list_workers()), 30)  # fmt: skip
    yield worker
    worker.stop(hurry=True)
    thread.join(30)


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_an_operator_sets_a_workers_concurrency_then_stops_it(admin_client, running):
    wid = running.worker_id
    page = admin_client.get(reverse("admin:django_jobq_workerinfo_changelist"))
    assert 'name="op" value="stop"' in page.content.decode()
    admin_client.post(reverse(CONTROL), {"worker_id": wid, "op": "concurrency", "n": "2"})

    def concurrency() -> int | None:
        found = [w for w in get_storage().list_workers() if w.worker_id == wid]
        return found[0].info.get("concurrency") if found else None

    assert wait_until(lambda: concurrency() == 2, 30)
    admin_client.post(reverse(CONTROL), {"worker_id": wid, "op": "stop"})
    assert running.stopped.wait(30)
    said = LogEntry.objects.filter(object_id=wid).values_list("change_message", flat=True)
    assert list(said.order_by("pk")) == ["Set concurrency to 2", "Stop (gracefully)"]


@pytest.mark.django_db(databases=["default"], transaction=True)
@pytest.mark.parametrize("fields", [
    {"op": "concurrency", "n": "0"}, {"op": "concurrency", "n": "99"},
    {"op": "concurrency", "n": "two"}, {"op": "concurrency"}, {"op": "explode"},
])  # fmt: skip
def test_bad_commands_are_refused_and_nothing_is_sent(admin_client, running, fields):
    response = admin_client.post(reverse(CONTROL), {"worker_id": running.worker_id, **fields})
    assert response.status_code == 302
    assert get_storage().take_worker_command(running.worker_id) is None
    assert not LogEntry.objects.filter(object_id=running.worker_id).exists()


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_only_a_user_with_the_permission_may_control_and_only_live_workers(admin_client, running):
    viewer = Client()
    viewer.force_login(staff("viewer", "view_workerinfo"))
    url = reverse(CONTROL)
    assert viewer.post(url, {"worker_id": running.worker_id, "op": "stop"}).status_code == 403
    page = viewer.get(reverse("admin:django_jobq_workerinfo_changelist")).content.decode()
    assert 'value="stop"' not in page
    assert admin_client.get(url).status_code == 405  # POST only (CSRF-checked)
    admin_client.post(url, {"worker_id": "no-such-worker", "op": "stop"})
    assert get_storage().take_worker_command("no-such-worker") is None
    assert not running.stopped.is_set()
