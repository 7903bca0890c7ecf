"""Re-create in Redis the journaled jobs it lost (after a restart from an older AOF, a
failover or a flush) and drop journal entries of finished jobs (docs/durability.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ...backend import get_storage
from ...errors import JobQError, StorageFull, StorageUnavailable
from ...queue.journal import reconcile
from ...validation import validate_queue_name


class Command(BaseCommand):
    help = (
        "Re-create in Redis every unfinished journaled job Redis no longer knows (same id and "
        "options; a job Redis still knows is never duplicated); delete entries of finished jobs."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "queues", nargs="*", help="queues to reconcile (default: every journaled one)"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="report what would be done, change nothing"
        )
        parser.add_argument(
            "--min-age",
            type=float,
            help="seconds an entry is left alone, its push may be on the way "
            "(default JOBQ['JOURNAL']['MIN_AGE'])",
        )
        parser.add_argument("--batch", type=int, help="entries per round trip")

    def handle(self, *args, **options):
        try:
            queues = [validate_queue_name(q) for q in options["queues"]]
            storage = get_storage()
        except JobQError as exc:
            raise CommandError(str(exc)) from exc
        if not storage.supports_journal:
            raise CommandError(
                f"{type(storage).__name__} keeps no journal: durability 'journal' is a Redis "
                "backend feature"
            )
        if options["batch"] is not None and options["batch"] < 1:
            raise CommandError("--batch must be a positive integer")
        if options["min_age"] is not None and options["min_age"] < 0:
            raise CommandError("--min-age must be >= 0")
        try:
            reports = reconcile(
                storage,
                queues or None,
                dry_run=options["dry_run"],
                min_age=options["min_age"],
                batch=options["batch"],
            )
        except StorageUnavailable as exc:
            what = "full" if isinstance(exc, StorageFull) else "unreachable"
            raise CommandError(f"Redis {what}, nothing more reconciled: {exc}") from exc
        prefix = "dry run: " if options["dry_run"] else ""
        if not reports:
            self.stdout.write(f"{prefix}journal is empty")
        for name, report in reports.items():
            self.stdout.write(f"{prefix}{name}: {report}")
