"""The demo's handlers: autodiscovered by django_jobq because this module is named jobs.py."""

import hashlib
import random

from django_jobq import PermanentError, handler


@handler("thumbnails")
def make_thumbnail(job):
    """Stands in for CPU work: derive a 'thumbnail' fingerprint from the image name."""
    name = job.payload["image"]
    if not name.endswith((".jpg", ".png")):
        raise PermanentError(f"{name} is not an image")  # retrying cannot fix bad input
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return {"image": name, "thumbnail": f"thumbs/{digest}.webp", "size": [128, 128]}


@handler("emails")
def send_email(job):
    """Stands in for a flaky SMTP server: the first attempts of some messages fail."""
    if job.payload.get("flaky") and job.attempt < 3:
        raise ConnectionError(f"SMTP timeout (attempt {job.attempt})")
    return {"to": job.payload["to"], "message_id": f"<{random.randrange(10**9)}@example>"}  # noqa: S311


# -- Task functions: a shop's Celery tasks, migrated (docs/migrating-from-celery.md) ----------
#
# Before (Celery):
#     @shared_task(autoretry_for=(ConnectionError,), max_retries=4, retry_backoff=True)
#     def charge(order_id, amount): ...
#     charge.delay(7, amount=1999)
#     chord([price.s(sku) for sku in skus], invoice.s(order_id=7)).delay()

from django_jobq import Backoff, task  # noqa: E402 - the task half of the demo

FLAKY_CHARGES: dict[int, int] = {}  # order id -> failed attempts so far (in the worker)


@task(queue="shop", name="shop.charge", max_attempts=5, retry_on=(ConnectionError,),
      backoff=Backoff.exponential(0.05, max_delay=1))  # fmt: skip
def charge(order_id: int, amount: int) -> dict:
    """Stands in for a payment API that times out twice, then answers."""
    if amount <= 0:
        raise ValueError(f"bad amount {amount}")  # not in retry_on: fails at once
    FLAKY_CHARGES[order_id] = FLAKY_CHARGES.get(order_id, 0) + 1
    if FLAKY_CHARGES[order_id] < 3:
        raise ConnectionError("payment gateway timeout")
    return {"order": order_id, "charged": amount}


@task(queue="shop", name="shop.price")
def price(sku: str) -> int:
    return 100 * len(sku)


@task(queue="shop", name="shop.invoice")
def invoice(prices: list, order_id: int) -> dict:
    return {"order": order_id, "lines": len(prices), "total": sum(prices)}
