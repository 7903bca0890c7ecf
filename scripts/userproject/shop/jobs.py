"""The shop's handlers (autodiscovered by django_jobq)."""

from django_jobq import PermanentError, handler, on_failure

from .models import Order
from .services import ALERTS, SENT

FLAKY_SMTP = {"failures_left": 0}  # the tests make the "mail server" fail a few times


@handler("emails")
def send_confirmation(job):
    order = Order.objects.get(pk=job.payload["order"])
    if "@" not in order.email:
        raise PermanentError(f"cannot mail {order.email!r}")
    if FLAKY_SMTP["failures_left"]:
        FLAKY_SMTP["failures_left"] -= 1
        raise ConnectionError("SMTP server not answering")
    SENT.append((order.email, f"Order {order.pk} confirmed"))
    Order.objects.filter(pk=order.pk).update(confirmed=True)
    return {"sent_to": order.email, "attempt": job.attempt}


@on_failure("emails")
def alert_support(payload, job, error):
    ALERTS.append(f"{job.id}: {error['message']}")


@handler("figures")
def figures(job):
    return {"eu": 120, "us": 80}[job.payload["region"]]


@handler("reports")
def report(job):
    return {"month": job.payload["month"], "total": sum(job.child_results.values())}
