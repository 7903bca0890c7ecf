import signal

from django.core.management.base import BaseCommand, CommandError

from ...errors import JobQError
from ...logutil import configure
from ...registry import registry
from ...worker import Worker


class Command(BaseCommand):
    help = "Run a django_jobq worker: claim jobs from the given queues and run their handlers."

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to serve (default: all handlers')")
        parser.add_argument("--concurrency", "-c", type=int, help="jobs in flight at once")
        parser.add_argument("--lease", type=int, help="lease (visibility timeout) in ms")
        parser.add_argument("--grace", type=float, help="seconds to finish jobs on SIGTERM")
        parser.add_argument("--batch", type=int, help="max jobs per claim")
        parser.add_argument("--worker-id", help="stable id (default: host-pid-random)")
        parser.add_argument(
            "--reap-interval", type=float, help="seconds between own stalled-job sweeps (0: off)"
        )

    def handle(self, *args, **options):
        configure(options["verbosity"])
        queues = options["queues"] or registry.queues()
        if not queues:
            raise CommandError("no queues given and no handlers registered (jobs.py modules)")
        try:
            worker = Worker(
                queues,
                concurrency=options["concurrency"],
                lease=options["lease"],
                grace=options["grace"],
                batch=options["batch"],
                worker_id=options["worker_id"],
                reap_interval=options["reap_interval"],
            )
            worker.check()
        except JobQError as exc:
            raise CommandError(str(exc)) from exc

        def on_signal(signum, frame):
            # First signal: graceful (finish in-flight within grace). Second: hurry.
            worker.stop(hurry=worker.stopping)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        worker.run()
