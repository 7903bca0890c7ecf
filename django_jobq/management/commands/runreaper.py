import signal

from django.core.management.base import BaseCommand

from ...logutil import configure
from ...reaper import Reaper


class Command(BaseCommand):
    help = "Requeue stalled jobs, promote due ones and fail jobs past max_stalls, in a loop."

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to sweep (default: all known)")
        parser.add_argument("--interval", type=float, help="seconds between sweeps")
        parser.add_argument("--once", action="store_true", help="sweep once and exit")
        parser.add_argument(
            "--no-mirror",
            action="store_true",
            help="do not run the model mirror here (run `manage.py runmirror` instead)",
        )

    def handle(self, *args, **options):
        configure(options["verbosity"])
        reaper = Reaper(
            options["queues"] or None,
            interval=options["interval"],
            mirror=False if options["no_mirror"] else None,
        )
        if options["once"]:
            for name, report in reaper.run_once().items():
                self.stdout.write(
                    f"{name}: requeued {len(report.requeued)}, failed {len(report.failed)},"
                    f" promoted {report.promoted}"
                )
            return
        signal.signal(signal.SIGTERM, lambda *_: reaper.stop())
        signal.signal(signal.SIGINT, lambda *_: reaper.stop())
        reaper.run()
