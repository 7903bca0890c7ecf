"""A database storage dropped without ``close()`` lets its wake-up thread and connection go.

The thread used to hold its storage through a bound method, so a storage nobody closed (the
process's storage after a ``JOBQ`` setting change, or one a program built and let go) kept
its thread, and on PostgreSQL its LISTEN session, until the process exited.
"""

from __future__ import annotations

import gc

import pytest
from django.test import override_settings

from django_jobq.backend import get_storage
from django_jobq.conf import jobq_settings
from django_jobq.storage.database import DatabaseStorage

from .helpers import listen_session_open, up_listener, wait_until


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_dropped_postgres_storage_ends_its_listener_and_listen_session():
    # Arrange: a storage whose LISTEN connection is up, told apart from other tests'
    # listeners by its server process.
    storage = DatabaseStorage("pg")
    listener = up_listener(storage)
    pid = listener.backend_pid
    assert listen_session_open(pid)
    # Act: the last reference goes, without close().
    del storage
    gc.collect()
    # Assert: the thread notices at its next look and closes its connection on the way out.
    assert wait_until(lambda: not listener.is_alive())
    assert wait_until(lambda: not listen_session_open(pid))


@pytest.mark.django_db(transaction=True)
def test_a_dropped_sqlite_storage_ends_its_watcher():
    storage = DatabaseStorage("default")
    watcher = up_listener(storage)
    del storage
    gc.collect()
    assert wait_until(lambda: not watcher.is_alive())


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_setting_change_lets_the_old_storage_go_but_not_while_it_is_held():
    conf = {**jobq_settings(), "BACKEND": "database", "DATABASE_ALIAS": "pg"}
    # Arrange: the process's storage under one JOBQ, its listener up, and a second one
    # whose storage the test keeps (as code that took get_storage() earlier may).
    with override_settings(JOBQ=conf):
        dropped = get_storage()
        dropped_listener = up_listener(dropped)
        pid = dropped_listener.backend_pid
        del dropped
    with override_settings(JOBQ={**conf, "PREFIX": "jobqtest-held"}):
        held = get_storage()
        held_listener = up_listener(held)
    # Act: both settings changes are undone; nothing references the first storage.
    gc.collect()
    # Assert: the dropped storage's thread and LISTEN session end; the held one's still runs
    # (its owner is alive: decided now, not after a wait) until it is closed.
    assert wait_until(lambda: not dropped_listener.is_alive())
    assert wait_until(lambda: not listen_session_open(pid))
    assert held_listener.running() and held_listener.is_alive()
    held.close()
    assert not held_listener.is_alive()
