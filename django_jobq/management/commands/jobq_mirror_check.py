from django.core.management.base import BaseCommand, CommandError

from ...mirror.check import check
from ...mirror.core import Mirror
from ...observability.logs import configure


class Command(BaseCommand):
    help = (
        "Compare the job rows with Redis (per-queue counts of the waiting and running states, "
        "and a sample of records) and re-read every queue that differs. Exits 1 when a "
        "difference was found (repaired unless --dry-run)."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to check (default: all known)")
        parser.add_argument("--sample", type=int, default=200, help="records compared per queue")
        parser.add_argument("--dry-run", action="store_true", help="report, do not repair")

    def handle(self, *args, **options):
        configure(options["verbosity"])
        try:
            mirror = Mirror(queues=options["queues"] or None)
        except TypeError as exc:
            raise CommandError(str(exc)) from exc
        reports = check(mirror, sample=options["sample"], repair=not options["dry_run"])
        for report in reports:
            self.stdout.write(str(report))
        if not all(r.consistent for r in reports):
            raise SystemExit(1)
