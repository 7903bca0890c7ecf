"""The shop's tests, written against the `jobq` fixture that installing django-jobq provides
(no import, no conftest: the pytest11 entry point registers it)."""

from decimal import Decimal

import django_jobq
import pytest
from django_jobq.errors import SerializationError
from django_jobq.testing import JobRunError

from shop.models import Order
from shop.services import ALERTS, SENT, monthly_report, place_order, send_receipt_with_the_total

pytestmark = pytest.mark.django_db


def test_this_run_uses_the_installed_package_not_a_checkout():
    assert "site-packages" in django_jobq.__file__


def test_placing_an_order_enqueues_its_confirmation(jobq, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        order = place_order("ada@example.com", Decimal("9.90"))

    (job,) = jobq.assert_enqueued("emails", id=f"confirm-{order.pk}")
    assert job.payload == {"order": order.pk}
    assert job.options.max_attempts == 4  # JOBQ["QUEUES"]["emails"] applies in tests too
    assert SENT == []  # nothing ran yet


def test_running_the_jobs_sends_the_mail(jobq, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        order = place_order("ada@example.com", Decimal("9.90"))

    (run,) = jobq.run_all()

    assert run.result == {"sent_to": "ada@example.com", "attempt": 1}
    assert SENT == [("ada@example.com", f"Order {order.pk} confirmed")]
    order.refresh_from_db()
    assert order.confirmed


def test_an_uncommitted_order_sends_nothing(jobq):
    place_order("ada@example.com", Decimal("1"))  # the test's transaction never commits

    jobq.assert_not_enqueued()


def test_a_payload_production_refuses_fails_here_too(jobq):
    order = Order.objects.create(email="ada@example.com", total=Decimal("9.90"))

    with pytest.raises(SerializationError):
        send_receipt_with_the_total(order)
    jobq.assert_not_enqueued()


def test_smtp_outages_are_retried_with_backoff(jobq, django_capture_on_commit_callbacks):
    from shop.jobs import FLAKY_SMTP

    FLAKY_SMTP["failures_left"] = 2
    with django_capture_on_commit_callbacks(execute=True):
        place_order("ada@example.com", Decimal("5"))
    start = jobq.now()

    runs = jobq.run_all()

    assert [r.outcome for r in runs] == ["retrying", "retrying", "completed"]
    assert (jobq.now() - start).total_seconds() >= 90  # 30 s, then 60 s (JOBQ min_backoff)
    assert len(SENT) == 1


def test_a_bad_address_is_a_dead_letter_and_support_is_alerted(jobq):
    order = Order.objects.create(email="nobody", total=Decimal("5"))
    django_jobq.get_queue("emails").enqueue(f"confirm-{order.pk}", {"order": order.pk})

    with pytest.raises(JobRunError, match="cannot mail 'nobody'"):
        jobq.run_all(fail_fast=True)
    jobq.run_all()  # the failure handler's call

    assert [d.status.job_id for d in jobq.dead_letters("emails")] == [f"confirm-{order.pk}"]
    assert ALERTS == [f"confirm-{order.pk}: cannot mail 'nobody'"]


def test_the_monthly_report_waits_for_its_figures(jobq):
    monthly_report("2026-11")

    runs = jobq.run_all()

    assert [r.queue for r in runs] == ["figures", "figures", "reports"]
    assert runs[-1].result == {"month": "2026-11", "total": 200}


def test_a_schedule_due_now_fires_in_run_all(jobq):
    from django_jobq.models import Schedule

    schedule = Schedule.objects.create(name="daily-report", queue="reports", interval=86400,
                                       payload={"month": "daily"})  # fmt: skip
    jobq.advance_to(schedule.next_run_at)

    (run,) = jobq.run_all()

    assert run.job_id.startswith("schedule.daily-report.")
    assert run.result == {"month": "daily", "total": 0}
