from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Compute per-queue and per-handler metrics from the job history on Spark and store "
        "them in QueueMetric (needs the 'spark' extra). Never run it inside a web process."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--master", help="local[*] (default, or $SPARK_MASTER), local[N], spark://host:7077"
        )
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--input", metavar="DIR", help="a jobq_export directory")
        source.add_argument(
            "--jdbc", action="store_true", help="read PostgreSQL directly over JDBC"
        )
        parser.add_argument(
            "--since", help="from this day on (whole days): 2026-03-01, 6h, 7d; default all"
        )
        parser.add_argument("--database", default="default", help="alias read and written")
        parser.add_argument(
            "--periods", default="minute,hour,day", help="comma-separated: minute,hour,day"
        )
        parser.add_argument("--shuffle-partitions", type=int, default=8)

    def handle(self, *args, **options):
        try:
            from ...contrib.spark import get_spark, run_analytics
            from ...contrib.spark.cli import parse_since
            from ...contrib.spark.history import HistoryUnavailable
        except ImportError as exc:
            raise CommandError(str(exc)) from None
        periods = tuple(p.strip() for p in options["periods"].split(",") if p.strip())
        try:
            since = parse_since(options["since"]) if options["since"] else None
            spark = get_spark(
                options["master"], app_name="jobq-analytics",
                shuffle_partitions=options["shuffle_partitions"],
            )  # fmt: skip
            result = run_analytics(
                spark, input_dir=options["input"], jdbc=options["jdbc"],
                using=options["database"], since=since, periods=periods,
            )  # fmt: skip
        except (ValueError, HistoryUnavailable) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{result.events} events → {result.metrics} metric rows "
            f"({', '.join(periods)}) on {spark.sparkContext.master}"
        )
