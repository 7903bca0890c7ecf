"""What the shop's views call: the code its tests exercise."""

from decimal import Decimal

from django.db import transaction
from django_jobq import get_queue
from django_jobq.queue.flows import enqueue_flow, node

from .models import Order

SENT: list[tuple[str, str]] = []  # the "mail server" of this example: (to, subject)
ALERTS: list[str] = []  # what the failure handler reported


def place_order(email: str, total: Decimal) -> Order:
    """Store the order and send its confirmation once the transaction commits."""
    with transaction.atomic():
        order = Order.objects.create(email=email, total=total)
        get_queue("emails").enqueue_on_commit(f"confirm-{order.pk}", {"order": order.pk})
    return order


def send_receipt_with_the_total(order: Order) -> None:
    """A bug: Decimal is not JSON. Production refuses this payload, so the test mode must too."""
    get_queue("emails").enqueue(f"receipt-{order.pk}", {"order": order.pk, "total": order.total})


def monthly_report(month: str) -> None:
    """One figure per region, then the report that sums them (a flow)."""
    regions = [node("figures", f"{month}-{r}", {"region": r}) for r in ("eu", "us")]
    enqueue_flow(node("reports", f"report-{month}", {"month": month}, children=regions))
