"""Django ``@task`` functions the Tasks-backend tests enqueue (module level, as Django requires)."""

from __future__ import annotations

import asyncio

from django.tasks import task

CALLS: list[tuple[str, object]] = []


@task
def add(a: int, b: int) -> int:
    CALLS.append(("add", (a, b)))
    return a + b


@task(priority=50)
def urgent(label: str) -> str:
    CALLS.append(("order", label))
    return label


@task(priority=-50)
def lazy(label: str) -> str:
    CALLS.append(("order", label))
    return label


@task
def explode() -> None:
    raise ValueError("task exploded")


@task(takes_context=True)
def with_context(context, x: int) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id, "x": x}


@task
async def async_double(x: int) -> int:
    await asyncio.sleep(0.01)
    return 2 * x


@task(queue_name="tasks-other")
def on_other_queue() -> str:
    return "other"


def not_a_task() -> None:
    CALLS.append(("not_a_task", None))


@task(takes_context=True)
def effect_then_fail_once(context, alias: str, key: str) -> str:
    """One row in ``jobq_test_effects``, then a failure on the first attempt (after the write)."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO jobq_test_effects (job_id) VALUES (%s)", [key])
    if context.attempt == 1:
        raise RuntimeError("after the write")
    return key
