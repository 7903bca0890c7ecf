from django.core.management.base import BaseCommand

from ...observability.logs import configure
from ...worker import stopsignals
from ...worker.reaper import Reaper


class Command(BaseCommand):
    help = (
        "Requeue stalled jobs, promote due ones, fail jobs past max_stalls and fire periodic"
        " schedules, in a loop."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to sweep (default: all known)")
        parser.add_argument("--interval", type=float, help="seconds between sweeps")
        parser.add_argument("--once", action="store_true", help="sweep once and exit")
        parser.add_argument(
            "--no-mirror",
            action="store_true",
            help="do not run the model mirror here (run `manage.py runmirror` instead)",
        )
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="do not fire periodic schedules from this reaper",
        )

        parser.add_argument(
            "--reconcile",
            action="store_true",
            default=None,
            help="reconcile the journal every JOBQ['JOURNAL']['RECONCILE_INTERVAL'] seconds "
            "(default: when the settings put a queue in durability 'journal')",
        )
        parser.add_argument(
            "--no-reconcile", action="store_false", dest="reconcile", help="never reconcile here"
        )

    def handle(self, *args, **options):
        configure(options["verbosity"])
        reaper = Reaper(
            options["queues"] or None,
            interval=options["interval"],
            mirror=False if options["no_mirror"] else None,
            schedules=not options["no_schedules"],
            reconcile=options["reconcile"],
        )
        if options["once"]:
            if reaper.schedules:
                synced = reaper.sync_schedules()  # JOBQ["SCHEDULES"] first, as run() does
                if synced is not None and synced.changed:
                    self.stdout.write(f"schedules synced: {synced}")
            for name, report in reaper.run_once().items():
                self.stdout.write(
                    f"{name}: requeued {len(report.requeued)}, failed {len(report.failed)},"
                    f" promoted {report.promoted}"
                )
            if reaper.last_fired:
                self.stdout.write(f"schedules: fired {', '.join(reaper.last_fired)}")
            return
        with stopsignals.relayed(lambda _: reaper.stop()):  # off the handler (see stopsignals)
            reaper.run()
