# ruff: noqa: F811 - `jobq`, the plugin's fixture, is imported and then requested by name
"""The test mode for users' own tests (django_jobq.testing): jobs their code enqueues through
``get_queue()``, ``@handler`` queues, flows, schedules and the Tasks backend are captured with
production's validation and serialiser, and run in the test's thread on demand with the
worker's rules (retries and backoff on a test clock, flows, failure handlers, schedules)."""

from __future__ import annotations

import datetime as dt
import unittest

import pytest
from django.db import transaction
from django.tasks import task_backends
from django.test import override_settings

from django_jobq import PermanentError, RateLimited
from django_jobq.backend import get_storage
from django_jobq.errors import (
    ConfigurationError,
    InvalidJobId,
    JobQError,
    PayloadTooLarge,
    SerializationError,
    Timeout,
)
from django_jobq.models import Schedule
from django_jobq.queue import get_queue
from django_jobq.queue.flows import chain, enqueue_flow, node
from django_jobq.states import JobState
from django_jobq.tasks.registry import registry
from django_jobq.testing import JobRunError, jobq_test_mode
from django_jobq.testing.pytest_plugin import jobq  # noqa: F401 - the fixture, by name
from django_jobq.testing.storage import CapturingStorage

from . import task_funcs


@pytest.fixture
def handlers():
    """Register handlers on the project's registry for one test (as an app's jobs.py would)."""
    added: list[str] = []

    def register(queue, func, **options):
        registry.register(queue, func, **options)
        added.append(queue)
        return func

    yield register
    for queue in added:
        registry.unregister(queue)


# -- capturing -------------------------------------------------------------------------------


def test_get_queue_enqueues_are_captured_with_payload_and_options(jobq):
    get_queue("tm-emails").enqueue("welcome-1", {"to": "ada@example.com"}, priority=3)

    (job,) = jobq.enqueued("tm-emails")
    assert (job.queue, job.id, job.payload) == ("tm-emails", "welcome-1", {"to": "ada@example.com"})
    assert job.priority == 3
    assert job.state is JobState.QUEUED
    assert job.run_at is None


def test_the_payload_is_the_serialised_one_the_handler_will_get(jobq):
    get_queue("tm-emails").enqueue("t", {"pair": (1, 2)})

    assert jobq.enqueued("tm-emails")[0].payload == {"pair": [1, 2]}  # JSON has no tuples


def test_a_duplicate_id_is_not_captured_twice(jobq):
    emails = get_queue("tm-emails")
    emails.enqueue("same", 1)
    assert emails.enqueue("same", 2).outcome == "duplicate"

    assert [j.payload for j in jobq.enqueued("tm-emails")] == [1]


@pytest.mark.parametrize(
    ("job_id", "payload", "error"),
    [
        ("ok", {"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}, SerializationError),
        ("ok", {"blob": "x" * (1024 * 1024 + 1)}, PayloadTooLarge),
        ("not an id!", {}, InvalidJobId),
    ],
    ids=["not-json", "too-large", "bad-id"],
)
def test_what_production_refuses_is_refused_and_not_captured(jobq, job_id, payload, error):
    with pytest.raises(error):
        get_queue("tm-emails").enqueue(job_id, payload)

    assert jobq.enqueued() == []


def test_per_queue_settings_apply_as_in_production(settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"tm-emails": {"max_attempts": 7}}}
    with jobq_test_mode() as mode:
        get_queue("tm-emails").enqueue("a", 1)
        assert mode.enqueued("tm-emails")[0].options.max_attempts == 7


def test_settings_changed_during_the_test_keep_the_test_storage(jobq, settings):
    settings.JOBQ = {"REDIS_URL": "redis://127.0.0.1:1/0", "QUEUES": {"tm-emails": {"priority": 4}}}

    get_queue("tm-emails").enqueue("a", 1)

    assert jobq.enqueued("tm-emails")[0].priority == 4


def test_a_journal_queue_runs_as_a_plain_one(handlers, settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"tm-j": {"durability": "journal"}}}
    handlers("tm-j", lambda job: job.payload * 2)
    with jobq_test_mode(schedules=False) as mode:  # no database access in this test
        get_queue("tm-j").enqueue("a", 21)
        assert [r.result for r in mode.run_all()] == [42]


def test_delays_show_when_the_job_becomes_runnable(jobq):
    get_queue("tm-emails").enqueue("later", 1, delay=dt.timedelta(hours=1))

    (job,) = jobq.enqueued("tm-emails")
    assert job.state is JobState.SCHEDULED
    assert job.run_at - jobq.now() > dt.timedelta(minutes=59)


# -- the settings override ---------------------------------------------------------------------


def test_the_mode_replaces_the_configured_storage_and_restores_it():
    before = type(get_storage())
    with jobq_test_mode() as mode:
        assert get_storage() is mode.storage
        assert get_queue("tm-emails").storage is mode.storage
    assert type(get_storage()) is before
    assert get_queue("tm-emails").storage is not mode.storage


def test_a_settings_override_inside_the_mode_can_end_after_it(settings):
    original = settings.JOBQ
    mode = jobq_test_mode()
    mode.enable()
    changed = override_settings(JOBQ={"QUEUES": {"tm-emails": {"priority": 4}}})
    changed.enable()  # e.g. pytest-django's settings fixture, set up before the jobq fixture
    mode.disable()  # the jobq fixture ends first
    changed.disable()

    assert settings.JOBQ == original
    assert not isinstance(get_storage(), CapturingStorage)


def test_modes_do_not_nest():
    with jobq_test_mode(), pytest.raises(ConfigurationError, match="already on"):
        jobq_test_mode().enable()


def test_a_decorated_function_runs_in_the_mode():
    @jobq_test_mode()
    def code_under_test():
        get_queue("tm-emails").enqueue("x", 1)
        return get_storage()

    storage = code_under_test()
    assert [j.id for j in storage.captured()] == ["x"]
    assert get_storage() is not storage


@jobq_test_mode()
class DecoratedTestCase(unittest.TestCase):
    def test_each_test_has_its_own_mode(self):
        get_queue("tm-emails").enqueue("y", 1)
        self.jobq.assert_enqueued("tm-emails", id="y", count=1)


def test_a_decorated_test_case_class_gets_a_fresh_mode_per_test():
    suite = unittest.TestSuite([DecoratedTestCase("test_each_test_has_its_own_mode")] * 2)
    result = unittest.TestResult()
    suite.run(result)
    assert result.wasSuccessful(), result.failures + result.errors
    assert result.testsRun == 2


# -- running -----------------------------------------------------------------------------------


def test_run_all_runs_jobs_in_this_thread_and_returns_their_results(jobq, handlers):
    import threading

    seen = []
    handlers("tm-echo", lambda job: seen.append(threading.get_ident()) or {"got": job.payload})
    get_queue("tm-echo").enqueue("a", 1)
    get_queue("tm-echo").enqueue("b", 2)

    runs = jobq.run_all()

    assert [(r.job_id, r.outcome, r.result) for r in runs] == [
        ("a", "completed", {"got": 1}),
        ("b", "completed", {"got": 2}),
    ]
    assert seen == [threading.get_ident()] * 2
    assert jobq.result("tm-echo", "a").value == {"got": 1}
    assert jobq.enqueued("tm-echo")[0].state is JobState.COMPLETED


def test_jobs_enqueued_by_handlers_run_in_the_same_run_all(jobq, handlers):
    handlers("tm-first", lambda job: get_queue("tm-second").enqueue(f"{job.id}-next", 1).job_id)
    handlers("tm-second", lambda job: "second")
    get_queue("tm-first").enqueue("a", None)

    assert [(r.queue, r.job_id) for r in jobq.run_all()] == [
        ("tm-first", "a"),
        ("tm-second", "a-next"),
    ]


def test_retries_run_through_their_backoff_on_the_test_clock(jobq, handlers):
    def flaky(job):
        if job.attempt < 3:
            raise ConnectionError(f"attempt {job.attempt}")
        return "ok"

    handlers("tm-flaky", flaky)
    get_queue("tm-flaky").enqueue("f", None, max_attempts=3, min_backoff=60_000)
    start = jobq.now()

    runs = jobq.run_all()

    assert [(r.attempt, r.outcome) for r in runs] == [
        (1, "retrying"), (2, "retrying"), (3, "completed"),
    ]  # fmt: skip
    assert runs[0].error["message"] == "attempt 1"
    assert jobq.now() - start >= dt.timedelta(minutes=3)  # 1 min, then 2 min of backoff


def test_without_advance_run_all_stops_where_nothing_is_due(jobq, handlers):
    handlers("tm-flaky", lambda job: 1 / (job.attempt - 1))
    get_queue("tm-flaky").enqueue("f", None, min_backoff=60_000)

    assert [r.outcome for r in jobq.run_all(advance=False)] == ["retrying"]
    assert jobq.status("tm-flaky", "f").state is JobState.RETRYING
    assert jobq.run_all(advance=False) == []

    jobq.advance(dt.timedelta(minutes=2))
    assert [r.outcome for r in jobq.run_all(advance=False)] == ["completed"]


def test_a_delayed_job_runs_only_when_the_clock_reaches_it(jobq, handlers):
    handlers("tm-echo", lambda job: job.payload)
    get_queue("tm-echo").enqueue("later", 1, delay=dt.timedelta(hours=2))

    assert jobq.run_all(advance=False) == []
    assert [r.job_id for r in jobq.run_all()] == ["later"]
    assert jobq.enqueued("tm-echo")[0].run_at <= jobq.now()


def test_run_one_takes_one_attempt_at_a_time(jobq, handlers):
    handlers("tm-flaky", lambda job: 1 / (job.attempt - 1))
    get_queue("tm-flaky").enqueue("f", None)

    first = jobq.run_one("tm-flaky")
    assert (first.attempt, first.outcome) == (1, "retrying")
    second = jobq.run_one("tm-flaky")
    assert (second.attempt, second.outcome) == (2, "completed")
    assert jobq.run_one() is None


def test_a_rate_limited_job_is_postponed_and_runs_later(jobq, handlers):
    tries = []

    def limited(job):
        tries.append(job.attempt)
        if len(tries) == 1:
            raise RateLimited(30)  # the API said "try again in 30 s": not a failed attempt
        return "ran"

    handlers("tm-rl", limited)
    get_queue("tm-rl").enqueue("r", None)
    start = jobq.now()

    assert [r.outcome for r in jobq.run_all()] == ["postponed", "completed"]
    assert tries == [1, 1]
    assert jobq.now() - start >= dt.timedelta(seconds=30)


def test_a_permanent_failure_is_a_dead_letter_and_calls_the_failure_handler(jobq, handlers):
    calls = []

    def bounce(job):
        raise PermanentError(f"bad address {job.payload['to']}")

    handlers("tm-bounce", bounce, on_failure=lambda payload, job, error: calls.append(
        (payload, job.id, error["message"])))  # fmt: skip
    get_queue("tm-bounce").enqueue("b", {"to": "nobody"})

    runs = jobq.run_all()

    assert [(r.kind, r.outcome) for r in runs] == [("job", "failed"), ("on_failure", "completed")]
    assert calls == [({"to": "nobody"}, "b", "bad address nobody")]
    (dead,) = jobq.dead_letters("tm-bounce")
    assert dead.status.job_id == "b"
    assert dead.payload == {"to": "nobody"}


def test_a_failing_failure_handler_is_reported_and_waits_for_its_backoff(jobq, handlers):
    def on_failure(payload, job, error):
        raise RuntimeError(f"pager down (call {job.tries})")

    handlers("tm-bounce", lambda job: 1 / 0, on_failure=on_failure)
    get_queue("tm-bounce").enqueue("b", None, max_attempts=1)

    runs = jobq.run_all()

    assert [(r.kind, r.outcome) for r in runs] == [("job", "failed"), ("on_failure", "failed")]
    assert "pager down (call 1)" in runs[1].error["message"]
    assert jobq.failure_calls("tm-bounce")[0].tries == 1
    jobq.advance(dt.timedelta(days=1))
    assert [r.error["message"] for r in jobq.run_all()] == ["pager down (call 2)"]


def test_flows_release_the_parent_with_its_childrens_results(jobq, handlers):
    handlers("tm-fetch", lambda job: job.payload * 10)
    handlers("tm-report", lambda job: sorted(job.child_results.values()))
    enqueue_flow(node("tm-report", "r", None,
                      children=[node("tm-fetch", "eu", 1), node("tm-fetch", "us", 2)]))  # fmt: skip

    runs = jobq.run_all()

    assert [r.job_id for r in runs] == ["eu", "us", "r"]
    assert runs[-1].result == [10, 20]


def test_a_chain_passes_each_result_on(jobq, handlers):
    handlers("tm-step", lambda job: (job.previous_result if job.children else 0) + job.payload)
    enqueue_flow(chain(node("tm-step", "a", 1), node("tm-step", "b", 2), node("tm-step", "c", 3)))

    assert [r.result for r in jobq.run_all()] == [1, 3, 6]


def test_a_batch_handler_gets_the_runnable_jobs_together(jobq, handlers):
    sizes = []

    def bulk(jobs):
        sizes.append(len(jobs))
        return [j.payload for j in jobs]

    handlers("tm-bulk", bulk, batch=10)
    get_queue("tm-bulk").enqueue_many([(f"j{i}", i) for i in range(3)])

    assert [r.result for r in jobq.run_all()] == [0, 1, 2]
    assert sizes == [3]


def test_progress_and_log_lines_are_stored_with_the_job(jobq, handlers):
    def work(job):
        job.set_progress(50)
        job.log("half way")

    handlers("tm-echo", work)
    get_queue("tm-echo").enqueue("p", None)
    jobq.run_all()

    status = jobq.status("tm-echo", "p")
    assert status.progress == 50
    assert [line for _, line in status.logs] == ["half way"]


def test_a_queue_with_jobs_and_no_handler_is_a_clear_error(jobq):
    get_queue("tm-nobody").enqueue("x", 1)

    with pytest.raises(ConfigurationError, match=r"\['tm-nobody'\].*no handler registered"):
        jobq.run_all()
    with pytest.raises(ConfigurationError, match=r"no handler registered for queue\(s\)"):
        jobq.run_all(queues=["tm-nobody"])
    assert jobq.run_all(queues=[]) == []
    assert jobq.status("tm-nobody", "x").state is JobState.QUEUED


def test_an_async_handler_runs_to_completion(jobq, handlers):
    import asyncio

    async def fetch(job):
        await asyncio.sleep(0)
        return job.payload + 1

    handlers("tm-async", fetch)
    get_queue("tm-async").enqueue("a", 1)

    assert [r.result for r in jobq.run_all()] == [2]


def test_a_job_that_keeps_making_jobs_is_stopped(jobq, handlers):
    handlers("tm-loop", lambda job: get_queue("tm-loop").enqueue(None, job.payload + 1).job_id)
    get_queue("tm-loop").enqueue("start", 0)

    with pytest.raises(JobQError, match="stopped after 50 runs"):
        jobq.run_all(max_runs=50)


def test_fail_fast_raises_with_the_handlers_traceback(jobq, handlers):
    def broken(job):
        raise PermanentError("the template is missing")

    handlers("tm-broken", broken)
    get_queue("tm-broken").enqueue("x", None)

    with pytest.raises(JobRunError, match=r"(?s)tm-broken/x attempt 1: failed.*in broken"):
        jobq.run_all(fail_fast=True)


def test_clear_forgets_jobs_and_runs(jobq, handlers):
    handlers("tm-echo", lambda job: 1)
    get_queue("tm-echo").enqueue("a", 1)
    jobq.run_all()
    get_queue("tm-echo").enqueue("b", 1)

    jobq.clear()

    assert jobq.enqueued() == [] and jobq.results == []
    assert jobq.status("tm-echo", "b") is None
    assert jobq.run_all() == []


def test_enqueue_and_wait_times_out_as_nothing_runs_meanwhile(jobq, handlers):
    handlers("tm-echo", lambda job: job.payload)

    with pytest.raises(Timeout):
        get_queue("tm-echo").enqueue_and_wait("w", 1, timeout=0.05)
    assert [r.result for r in jobq.run_all()] == [1]


# -- assertions ------------------------------------------------------------------------------


def test_assert_enqueued_lists_what_was_enqueued_instead(jobq):
    get_queue("tm-emails").enqueue("a", {"to": "ada"})
    get_queue("tm-sms").enqueue("s", 1)

    assert jobq.assert_enqueued("tm-emails", payload={"to": "ada"})[0].id == "a"
    with pytest.raises(AssertionError) as err:
        jobq.assert_enqueued("tm-emails", payload={"to": "bob"})
    assert str(err.value) == (
        "expected a job on queue 'tm-emails' with payload={'to': 'bob'}, found 0. Enqueued on"
        " 'tm-emails': tm-emails/a payload={'to': 'ada'} (jobs were enqueued on ['tm-sms'])"
    )
    with pytest.raises(AssertionError, match="expected 2 job"):
        jobq.assert_enqueued("tm-emails", count=2)


def test_assert_not_enqueued(jobq):
    jobq.assert_not_enqueued()
    get_queue("tm-emails").enqueue("a", 1)
    jobq.assert_not_enqueued("tm-sms")
    with pytest.raises(AssertionError, match=r"expected no job anywhere, found 1: tm-emails/a"):
        jobq.assert_not_enqueued()


def test_assert_no_failures_shows_each_traceback(jobq, handlers):
    handlers("tm-flaky", lambda job: 1 / (job.attempt - 1))
    get_queue("tm-flaky").enqueue("f", None)
    jobq.run_all()

    with pytest.raises(AssertionError, match=r"(?s)1 run\(s\) raised.*ZeroDivisionError"):
        jobq.assert_no_failures()


# -- transactions, schedules, Tasks ----------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_on_commit_is_sent_when_the_transaction_commits(
    jobq, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            get_queue("tm-emails").enqueue_on_commit("c", 1)
            jobq.assert_not_enqueued()
    jobq.assert_enqueued("tm-emails", id="c")


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_is_dropped_on_rollback(jobq):
    with pytest.raises(RuntimeError), transaction.atomic():
        get_queue("tm-emails").enqueue_on_commit("never", 1)
        raise RuntimeError("rollback")
    jobq.assert_not_enqueued()


@pytest.mark.django_db
def test_handlers_see_the_tests_uncommitted_rows(jobq, handlers):
    handlers("tm-db", lambda job: list(Schedule.objects.values_list("name", flat=True)))
    Schedule.objects.create(name="tm-row", queue="tm-db", interval=3600, enabled=False)
    get_queue("tm-db").enqueue("x", None)

    assert jobq.run_all()[0].result == ["tm-row"]


@pytest.mark.django_db
def test_due_schedules_fire_and_run(jobq, handlers):
    handlers("tm-tick", lambda job: job.payload)
    schedule = Schedule.objects.create(name="tm-hourly", queue="tm-tick", interval=3600,
                                       payload={"n": 1})  # fmt: skip
    assert jobq.run_all() == []  # its first tick is an hour away

    jobq.advance_to(schedule.next_run_at)
    runs = jobq.run_all()

    assert [(r.queue, r.result) for r in runs] == [("tm-tick", {"n": 1})]
    assert runs[0].job_id.startswith("schedule.tm-hourly.")


def test_without_database_access_the_fixture_fires_no_schedules(jobq):
    assert jobq.runner.schedules is False


@pytest.mark.django_db
def test_the_tasks_backend_enqueues_into_the_test_mode():
    task_funcs.CALLS.clear()
    backend = task_backends["default"]  # TASKS in tests/settings.py: no STORAGE option
    backend.queue("default")  # used before the mode (an earlier test): built on JOBQ's storage
    with jobq_test_mode() as jobq:
        result = task_funcs.add.enqueue(2, 3)

        (job,) = jobq.enqueued("default")
        assert job.payload["args"] == [2, 3]
        assert [r.outcome for r in jobq.run_all(queues=["default"])] == ["completed"]
        assert backend.get_result(result.id).return_value == 5
    assert task_funcs.CALLS == [("add", (2, 3))]
    task_funcs.CALLS.clear()
