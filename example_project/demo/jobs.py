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
