"""``path("jobq/", include("django_jobq.api.urls"))``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt

from . import require_drf

require_drf()

from . import broadcasts, dead, events, jobs, listing, operations, queues, schema  # noqa: E402
from .converters import JobIdConverter, QueueNameConverter  # noqa: E402


@csrf_exempt  # it changes nothing; without this a POST got Django's HTML CSRF page, not JSON
def not_found(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"detail": "Not found."}, status=404)


def patterns() -> list[Any]:
    """This URLconf's patterns, for the API root's list of endpoints."""
    return urlpatterns


register_converter(QueueNameConverter, "jobq_queue")
register_converter(JobIdConverter, "jobq_job")

app_name = "jobq-api"
Q = "queues/<jobq_queue:queue>/"
J = Q + "jobs/<jobq_job:job_id>/"
B = "broadcasts/<jobq_queue:broadcast>/"
G = B + "groups/<jobq_queue:group>/"

urlpatterns: list[Any] = [
    path("", schema.RootView.as_view(patterns=patterns), name="root"),
    path("health", operations.HealthView.as_view(), name="health"),
    path("jobs/", listing.JobListView.as_view(), name="job-list"),
    path("queues/", queues.QueueListView.as_view(), name="queue-list"),
    path(Q, queues.QueueDetailView.as_view(), name="queue-detail"),
    path(Q + "pause/", queues.PauseView.as_view(), name="queue-pause"),
    path(Q + "resume/", queues.ResumeView.as_view(), name="queue-resume"),
    path(Q + "jobs/", jobs.EnqueueView.as_view(), name="enqueue"),
    path(Q + "bulk/", jobs.BulkEnqueueView.as_view(), name="enqueue-bulk"),
    path(J, jobs.JobStatusView.as_view(), name="job-status"),
    path(J + "result/", jobs.JobResultView.as_view(), name="job-result"),
    path(J + "cancel/", jobs.CancelView.as_view(), name="job-cancel"),
    path(J + "retry/", jobs.RetryView.as_view(), name="job-retry"),
    path(Q + "dead/", dead.DeadLetterListView.as_view(), name="dead-letters"),
    path(Q + "events/", events.EventStreamView.as_view(), name="queue-events"),
    path("workers/", operations.WorkerListView.as_view(), name="worker-list"),
    path("schedules/", operations.ScheduleCreateView.as_view(), name="schedule-list"),
    path("schedules/<str:name>/", operations.ScheduleDetailView.as_view(), name="schedule"),
    path("schedules/<str:name>/run/", operations.ScheduleRunView.as_view(), name="schedule-run"),
    path("schema/", schema.SchemaView.as_view(), name="schema"),
    path("broadcasts/", broadcasts.BroadcastListView.as_view(), name="broadcast-list"),
    path(B, broadcasts.BroadcastDetailView.as_view(), name="broadcast-detail"),
    path(B + "publish/", broadcasts.PublishView.as_view(), name="broadcast-publish"),
    path(G, broadcasts.GroupStatusView.as_view(), name="broadcast-group"),
    path(G + "dead/", broadcasts.DeadMessageListView.as_view(), name="broadcast-dead"),
    path(
        G + "dead/retry/", broadcasts.DeadMessageRetryView.as_view(), name="broadcast-dead-retry"
    ),  # fmt: skip
    path(
        G + "dead/purge/", broadcasts.DeadMessagePurgeView.as_view(), name="broadcast-dead-purge"
    ),  # fmt: skip
    # Last: a path under the API that no route above takes (an empty queue name or job id, a
    # typo) answers the API's JSON error body, not Django's HTML page. It reads nothing, so it
    # needs no credentials; it is no DRF view, so the schema leaves it out.
    re_path(r"^.*$", not_found, name="not-found"),
]
