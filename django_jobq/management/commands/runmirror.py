from django.core.management.base import BaseCommand, CommandError

from ...mirror.core import Mirror
from ...observability.logs import configure
from ...worker import stopsignals


class Command(BaseCommand):
    help = (
        "Mirror job state from the Redis event streams into the Job/JobEvent/WorkerInfo models "
        "(runreaper does this too unless started with --no-mirror)."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to mirror (default: all known)")
        parser.add_argument("--batch", type=int, help="events per batch (one transaction each)")
        parser.add_argument(
            "--once", action="store_true", help="mirror what is there now, then exit"
        )

    def handle(self, *args, **options):
        configure(options["verbosity"])
        try:
            mirror = Mirror(queues=options["queues"] or None, batch=options["batch"])
        except TypeError as exc:
            raise CommandError(str(exc)) from exc
        if options["once"]:
            n = mirror.drain()
            self.stdout.write(f"mirrored {n} events")
            return
        with stopsignals.relayed(lambda _: mirror.stop()):  # off the handler (see stopsignals)
            mirror.run()
