"""The same test mode from Django's TestCase, as a class decorator and a context manager."""

from decimal import Decimal

from django.test import TestCase
from django_jobq import get_queue
from django_jobq.testing import jobq_test_mode

from shop.models import Order
from shop.services import SENT, place_order


@jobq_test_mode()
class DecoratedOrderTests(TestCase):
    def test_confirmation_is_sent_after_commit(self):
        with self.captureOnCommitCallbacks(execute=True):
            order = place_order("grace@example.com", Decimal("3"))

        self.jobq.assert_enqueued("emails", id=f"confirm-{order.pk}")
        self.jobq.run_all()
        self.jobq.assert_no_failures()
        self.assertEqual(SENT[-1], ("grace@example.com", f"Order {order.pk} confirmed"))


class ContextManagerTests(TestCase):
    def test_jobs_run_on_demand(self):
        order = Order.objects.create(email="linus@example.com", total=Decimal("1"))
        with jobq_test_mode() as jobq:
            get_queue("emails").enqueue("by-hand", {"order": order.pk})
            self.assertEqual([r.outcome for r in jobq.run_all()], ["completed"])
        order.refresh_from_db()
        self.assertTrue(order.confirmed)
