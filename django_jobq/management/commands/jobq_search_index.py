"""Create (or drop) the PostgreSQL trigram index that lets the admin search the payloads of
every job, not only the newest ones.

Why a command and not a migration: every enqueue writes the index (bulk enqueue was 10-30 %
slower with it here), so it is the operator's choice for a site that searches payloads. It is
built with ``CREATE INDEX CONCURRENTLY``: enqueues and claims go on meanwhile.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from ...admin.common import jobs_alias
from ...admin.search import PAYLOAD_INDEX, PAYLOAD_INDEX_SQL, PAYLOAD_STATISTICS_SQL


class Command(BaseCommand):
    help = (
        "Create the trigram index of job payloads on PostgreSQL (the admin's payload search "
        "then covers every job); --drop removes it."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", help="the alias of the job rows (default: the admin's)")
        parser.add_argument("--drop", action="store_true", help="drop the index instead")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or jobs_alias()
        if alias not in connections:
            raise CommandError(f"no database {alias!r} in DATABASES")
        connection = connections[alias]
        if connection.vendor != "postgresql":
            raise CommandError(
                f"database {alias!r} is {connection.vendor}: the payload index is PostgreSQL's "
                "(elsewhere the admin searches the newest jobs and says so)"
            )
        statements = (
            [f"DROP INDEX CONCURRENTLY IF EXISTS {PAYLOAD_INDEX}",
             "DROP STATISTICS IF EXISTS jobq_job_payload_text"]
            if options["drop"]
            else ["CREATE EXTENSION IF NOT EXISTS pg_trgm", PAYLOAD_INDEX_SQL,
                  PAYLOAD_STATISTICS_SQL, "ANALYZE django_jobq_job"]
        )  # fmt: skip
        try:
            with connection.cursor() as cursor:  # autocommit: CONCURRENTLY needs no transaction
                for sql in statements:
                    cursor.execute(sql)
        except DatabaseError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from exc
        done = "dropped" if options["drop"] else "ready: payload search covers every job"
        self.stdout.write(f"{PAYLOAD_INDEX} on {alias}: {done}")
