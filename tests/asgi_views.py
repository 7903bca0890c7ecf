"""Async views for the ASGI test: they enqueue a task function and wait for its value, and
read a job's status, through the async producer API only."""

from django.http import HttpRequest, JsonResponse

from django_jobq import JobFailed
from django_jobq.queue import get_queue

from .jobsapp.jobs import proc_add


async def add_and_wait(request: HttpRequest, a: int, b: int) -> JsonResponse:
    try:
        value = await proc_add.aenqueue_and_wait(a, b, wait_timeout=60)
    except JobFailed as exc:
        return JsonResponse({"error": exc.error}, status=500)
    return JsonResponse({"sum": value["sum"]})


async def enqueue_only(request: HttpRequest, job_id: str) -> JsonResponse:
    result = await proc_add.aenqueue(1, 2, job_id=job_id)
    status = await get_queue("tests-tasks").aget_status(job_id)
    return JsonResponse({"outcome": result.outcome.value, "state": status.state.value})
