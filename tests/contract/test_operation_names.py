"""Each storage operation has one name in every backend, so a transition reads side by side in
three files: ``storage/redis/lua/<script>.lua``, ``storage/database/<module>.py`` and
``storage/memory/<module>.py`` (docs/ARCHITECTURE.md, "Operations by name").

``OPERATIONS`` is that table: module → {method of ``Storage``: the Lua scripts the Redis
backend runs for it}. The tests hold the backends to it, so a method added in one place and
not the others, or a script nobody runs, shows here.
"""

from __future__ import annotations

import inspect

import pytest

from django_jobq.storage.base import Storage
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.memory import MemoryStorage
from django_jobq.storage.redis import broadcast as redis_broadcast
from django_jobq.storage.redis import storage as redis_storage
from django_jobq.storage.redis.scripts import LUA_DIR, NAMES

OPERATIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "enqueue": {
        "enqueue": ("enqueue_one",),
        "enqueue_many": ("enqueue",),
        "enqueue_and_wait": ("enqueue_one",),
    },
    "claim": {
        "claim": ("claim",),
        "wait_and_claim": ("claim",),
        "heartbeat": ("heartbeat",),
        "complete": ("complete_many",),
        "fail": ("fail",),
        "cancel_active": ("fail",),
        "release": ("release",),
        "postpone": ("postpone",),
        "report": ("report",),
        "ack_many": ("complete_many", "complete", "fail", "release", "postpone"),
        "cancel_requests": (),
        "reap": ("reap", "retain"),  # the reaper's pass applies retention too
    },
    "operations": {
        "request_cancel": ("cancel",),
        "cancel": ("cancel",),
        "change": ("change",),
        "retry": ("retry",),
        "dead_letters": ("records",),
        "count_dead": (),
        "parked": (),
        "purge_dead": ("clean",),
        "delete_finished": ("clean",),
        "get_record": (),
        "counts": (),
        "oldest_queued": (),
        "pause": (),
        "resume": ("control",),
        "is_paused": (),
        "set_limits": ("control",),
        "get_limits": (),
        "drain": ("drain",),
        "clean": ("clean",),
        "obliterate": ("control",),
        "register_queue": (),
        "list_queues": (),
        "register_worker": (),
        "deregister_worker": (),
        "list_workers": (),
        "send_worker_command": (),
        "take_worker_command": (),
        "broadcasts": (),
    },
    "retention": {
        "set_retention": (),
        "get_retention": (),
    },
    "events": {
        "read_events": ("events",),
        "read_events_many": ("events",),
    },
    "failures": {
        "set_failure_hook": (),
        "failure_hook": (),
        "claim_failure_calls": ("onfail_claim",),
        "settle_failure_call": ("onfail_settle",),
        "count_failure_calls": (),
        "failure_calls": (),
    },
}
#: Methods every backend inherits or implements by the nature of its store, not a transition:
#: the waits (the database backend's ``wakeups.py``; a condition on the memory backend; BLPOP
#: on Redis, with ``unwait.lua`` withdrawing a waiter that gave up), the error translation, the
#: async twins and the defaults of ``Storage``.
NOT_TRANSITIONS = {
    "wait_for_jobs", "interrupt_wait", "wait_for_outcome", "close", "unavailable", "job_states",
    "aregister_queue", "aenqueue", "aget_record", "await_for_outcome", "queue_summaries",
}  # fmt: skip
BACKENDS = {"database": DatabaseStorage, "memory": MemoryStorage}


def storage_methods() -> set[str]:
    return {n for n, v in vars(Storage).items() if callable(v) and not n.startswith("_")}


def defined_in(cls: type, method: str) -> set[str]:
    """The modules of the backend's own classes that define ``method`` (an override too); none
    for a backend that keeps ``Storage``'s default (a loop over the one-job step, say)."""
    own = cls.__mro__[: cls.__mro__.index(Storage)]
    return {klass.__module__.rpartition(".")[2] for klass in own if method in vars(klass)}


def test_the_table_names_every_operation_of_the_contract_once():
    named = [m for methods in OPERATIONS.values() for m in methods]
    assert len(named) == len(set(named))
    assert set(named) | NOT_TRANSITIONS == storage_methods()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("module", sorted(OPERATIONS))
def test_each_backend_defines_an_operation_in_the_module_of_its_name(backend, module):
    cls = BACKENDS[backend]
    misplaced = {m: sorted(found) for m in OPERATIONS[module]
                 if (found := defined_in(cls, m)) and module not in found}  # fmt: skip
    assert misplaced == {}, f"storage/{backend}/: not in {module}.py"


def test_every_script_the_table_names_exists_and_is_run_for_it():
    source = inspect.getsource(redis_storage)
    for module, methods in OPERATIONS.items():
        for method, scripts in methods.items():
            for script in scripts:
                assert (LUA_DIR / f"{script}.lua").is_file(), f"{module}.{method}: {script}"
                assert f'"{script}"' in source, f"{module}.{method}: {script} is never run"


def test_every_script_is_in_the_table_or_is_a_step_inside_one():
    named = {s for methods in OPERATIONS.values() for scripts in methods.values() for s in scripts}
    assert set(NAMES) - named == {"unwait"}  # wait_for_outcome giving up (NOT_TRANSITIONS)
    assert {p.stem for p in LUA_DIR.glob("*.lua")} == set(NAMES) | set(redis_broadcast.NAMES)
