"""The installed wheel, used as a user would: migrate, enqueue on Redis, one runworker runs the
job, the result comes back, the admin and the API schema render, the Spark module imports.

Run from a directory outside the checkout with the venv that has the wheel installed; it fails
loudly when the package is imported from a source tree instead.
"""

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent


def check(ok: bool, what: str) -> None:
    if not ok:
        sys.exit(f"smoke: FAILED: {what}")
    print(f"smoke: ok: {what}")


def main() -> None:
    os.environ.setdefault("SMOKE_PREFIX", f"jobqsmoke-{uuid.uuid4().hex[:8]}")
    os.environ["DJANGO_SETTINGS_MODULE"] = "smoke_settings"
    import django

    django.setup()
    import django_jobq

    where = Path(django_jobq.__file__).resolve()
    check("site-packages" in where.parts, f"django_jobq is the installed one ({where})")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    check(True, "migrate")

    from django_jobq import get_queue

    queue = get_queue("smoke")
    job_id = f"smoke-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", "smoke", "--concurrency", "2"],
        cwd=HERE, env=env,
    )  # fmt: skip
    try:
        result = queue.enqueue_and_wait(job_id, {"a": 2, "b": 3}, timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    check(result == {"sum": 5}, f"runworker ran the job on Redis, the result came back: {result}")
    check(code == 0, f"runworker stopped cleanly on SIGTERM (exit {code})")

    from django_jobq.mirror import Mirror

    Mirror(queues=["smoke"]).drain()
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_jobq.models import Job

    admin = get_user_model().objects.create_superuser("smoke", "smoke@example.com", "pw-smoke")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/django_jobq/queueconfig/q/smoke/")
    check(page.status_code == 200 and b"smoke" in page.content, "admin queue page renders")
    row = Job.objects.get(queue="smoke", job_id=job_id)
    page = client.get(f"/admin/django_jobq/job/{row.pk}/change/")
    check(page.status_code == 200 and job_id.encode() in page.content, "admin job page renders")
    page = client.get("/jobq/schema/")
    check(page.status_code == 200 and b"openapi" in page.content, "API schema answers")
    if os.environ.get("SMOKE_SPARK", "1") == "1":
        import pyspark

        import django_jobq.contrib.spark  # noqa: F401

        check(True, f"django_jobq.contrib.spark imports (pyspark {pyspark.__version__})")

    from django.conf import settings

    from django_jobq.storage.redis.connection import client_from_url

    redis = client_from_url(settings.JOBQ["REDIS_URL"])
    keys = list(redis.scan_iter(match="{" + os.environ["SMOKE_PREFIX"] + "*", count=1000))
    if keys:
        redis.delete(*keys)


if __name__ == "__main__":
    main()
