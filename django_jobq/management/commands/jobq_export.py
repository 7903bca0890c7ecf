from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Write the job and event history not exported yet to a directory as Parquet, "
        "partitioned by queue and date (needs the 'spark' extra)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--to", required=True, metavar="DIR", help="export root directory")
        parser.add_argument(
            "--since", help="nothing older than this: 2026-03-01, 2026-03-01T12:00Z, 6h, 7d"
        )
        parser.add_argument("--database", default="default", help="database alias to read")
        parser.add_argument("--chunk", type=int, default=50_000, help="rows per read and file")
        parser.add_argument(
            "--settle", type=float, default=60.0,
            help="seconds an event must be old before the watermark passes it (default 60)",
        )  # fmt: skip
        parser.add_argument(
            "--full", action="store_true", help="forget the watermark and rewrite everything"
        )

    def handle(self, *args, **options):
        try:
            from ...contrib.spark.cli import parse_since
            from ...contrib.spark.export import export_history
        except ImportError as exc:
            raise CommandError(str(exc)) from None
        try:
            since = parse_since(options["since"]) if options["since"] else None
            result = export_history(
                options["to"], since=since, using=options["database"], chunk=options["chunk"],
                settle=options["settle"], full=options["full"],
            )  # fmt: skip
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"exported {result.events} events and {result.jobs} jobs in {result.files} files "
            f"to {options['to']} (events up to id {result.last_event_id})"
        )
