"""The README's demo: start a worker, put jobs on queues, show what happened, stop cleanly."""

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from django_jobq import JobFailed, JobState
from django_jobq.backend import get_storage
from django_jobq.queue import Queue

MANAGE = Path(settings.BASE_DIR) / "manage.py"


def describe(storage) -> str:
    using = getattr(storage, "using", None)
    if using is not None:
        vendor = connections[using].vendor
        return f"database ({vendor}, DATABASES[{using!r}]) - the embedded default, no server"
    return type(storage).__name__


class Command(BaseCommand):
    help = "Run the django_jobq demo: a worker, deduplication, request/response, retries."

    def handle(self, *args, **options):
        storage = get_storage()
        try:
            storage.list_queues()
        except Exception as exc:
            raise CommandError(f"storage is not reachable ({exc})") from exc
        self.stdout.write(f"backend: {describe(storage)}")
        run = uuid.uuid4().hex[:6]  # fresh ids each run, so reruns show new work
        worker = self.start(["runworker", "thumbnails", "emails", "-c", "8"])
        reaper = self.start(["runreaper"])
        try:
            self.wait_for_worker(storage)
            self.scenarios(run)
        finally:
            for proc in (worker, reaper):
                proc.send_signal(signal.SIGTERM)
            for proc in (worker, reaper):
                proc.wait(30)
        self.stdout.write(self.style.SUCCESS("worker stopped cleanly; demo done"))

    def start(self, argv):
        return subprocess.Popen([sys.executable, str(MANAGE), *argv, "-v", "0"])

    def wait_for_worker(self, storage):
        deadline = time.monotonic() + 30
        while not storage.list_workers():
            if time.monotonic() > deadline:
                raise CommandError("the worker did not start within 30 s")
            time.sleep(0.1)
        self.stdout.write(f"worker up: {storage.list_workers()[0].worker_id}")

    def scenarios(self, run):
        thumbs, emails = Queue("thumbnails"), Queue("emails")
        say = self.stdout.write

        say("\n1. Fire-and-forget with caller-chosen ids (deduplicated):")
        for image in ("cat.jpg", "dog.png", "cat.jpg"):
            result = thumbs.enqueue(f"thumb-{run}-{image.replace('.', '-')}", {"image": image})
            say(f"   enqueue {image:8} -> {result.outcome.value}")

        say("\n2. Request/response (enqueue_and_wait):")
        start = time.perf_counter()
        value = thumbs.enqueue_and_wait(f"rr-{run}", {"image": "sunset.jpg"}, timeout=10)
        say(f"   {value}  in {(time.perf_counter() - start) * 1000:.1f} ms")

        say("\n3. A flaky handler retried with exponential backoff:")
        value = emails.enqueue_and_wait(
            f"mail-{run}", {"to": "ada@example.com", "flaky": True}, timeout=20
        )
        status = emails.get_status(f"mail-{run}")
        say(f"   {value} after {status.attempts} attempts")

        say("\n4. Bad input fails at once (PermanentError), with the remote error:")
        try:
            thumbs.enqueue_and_wait(f"bad-{run}", {"image": "notes.txt"}, timeout=10)
        except JobFailed as exc:
            say(f"   JobFailed: {exc.error['message']}")

        say("\n5. Cancel a job before it runs:")
        thumbs.enqueue(f"later-{run}", {"image": "later.jpg"}, delay=60_000)
        say(f"   cancel -> {thumbs.cancel(f'later-{run}').value}")

        say("\n6. Bulk enqueue 2,000 jobs and let the worker drain them:")
        start = time.perf_counter()
        thumbs.enqueue_many([(f"bulk-{run}-{i}", {"image": f"img{i}.jpg"}) for i in range(2000)])
        enq = time.perf_counter() - start
        ids = [f"bulk-{run}-{i}" for i in range(2000)]
        deadline = time.monotonic() + 60
        while thumbs.counts()[JobState.QUEUED] or thumbs.counts()[JobState.ACTIVE]:
            if time.monotonic() > deadline:
                raise CommandError("the worker did not drain the queue within 60 s")
            time.sleep(0.02)
        total = time.perf_counter() - start
        say(f"   enqueued in {enq * 1000:.0f} ms; all done in {total * 1000:.0f} ms")
        say(f"   result of {ids[-1]}: {thumbs.get_result(ids[-1]).value}")

        say("\nQueue counts:")
        for queue in (thumbs, emails):
            counts = {s.value: n for s, n in queue.counts().items() if n}
            say(f"   {queue.name:10} {counts}")
