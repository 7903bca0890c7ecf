"""The task-function demo (a shop's Celery tasks, migrated): a worker serves the "shop" queue;
a call with retries, a bad call refused at the caller, a chord, and a failure that does not
retry. Exits non-zero when an outcome is not the expected one (tests/test_example_tasks.py
runs it)."""

import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from django_jobq import InvalidPayload, JobFailed, JobQError
from django_jobq.backend import get_storage
from django_jobq.tasks import chord, group

from ...jobs import charge, invoice, price


class Command(BaseCommand):
    help = "Run the task-function demo: @task, enqueue_and_wait, retries, a chord."

    def handle(self, *args, **options):
        storage = get_storage()
        manage = str(settings.BASE_DIR / "manage.py")
        proc = subprocess.Popen([sys.executable, manage, "runworker", "shop", "-c", "4",
                                 "-v", "0"])  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not storage.list_workers():
                if time.monotonic() > deadline:
                    raise CommandError("the worker did not start within 60 s")
                time.sleep(0.1)
            self.scenarios()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        self.stdout.write(self.style.SUCCESS("tasks demo done"))

    def expect(self, what, got, expected):
        self.stdout.write(f"{what}: {got}")
        if got != expected:
            raise CommandError(f"{what}: expected {expected!r}")

    def scenarios(self):
        order = int(time.time() * 1000) % 1_000_000_000
        got = charge.enqueue_and_wait(order, amount=1999, wait_timeout=60)
        self.expect("charge (retried on ConnectionError)", got, {"order": order, "charged": 1999})
        try:
            charge.enqueue(order)
        except InvalidPayload as exc:
            self.stdout.write(f"refused at the caller: {exc}")
        else:
            raise CommandError("a call missing an argument was accepted")
        try:
            charge.enqueue_and_wait(order, amount=0, wait_timeout=60)
        except JobFailed as exc:
            self.expect("bad amount, no retry", exc.error["message"], "bad amount 0")
        final = chord(group(*(price.s(s) for s in ("tea", "scone", "jam"))),
                      invoice.s(order_id=order)).enqueue()  # fmt: skip
        try:  # Celery: AsyncResult.get(timeout=60) on the chord
            value = final.get(timeout=60)
        except JobQError as exc:  # CanvasFailed names the member, CanvasTimeout the unfinished
            raise CommandError(f"the chord did not complete: {exc}") from exc
        self.expect("chord", value, {"order": order, "lines": 3, "total": 1100})
