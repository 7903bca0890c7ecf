"""The admin's job list on millions of rows (issue 37): an index by handler (its filter and
prefix search), one by state and creation time (a state filter's deep pages), partial indexes of finished rows for the sort by finish time within a queue or
a state, and on PostgreSQL a trigram index for the search in errors (the one for payloads
is ``manage.py jobq_search_index``'s, by choice).

The trigram indexes need the ``pg_trgm`` extension (trusted since PostgreSQL 13: a database
owner may create it). When it cannot be created, the migration goes on without them and the
admin searches the newest jobs only, saying so (``admin/search.py``). Their expressions are
those of ``PayloadText`` / ``ErrorText`` there, bounds included: change both together.

On a big, busy table, create the indexes beforehand with ``CREATE INDEX CONCURRENTLY`` (the
statements below, with CONCURRENTLY added): this migration then finds them and skips them.
"""

from django.db import DatabaseError, migrations, models, transaction

# The payload's trigram index is not made here: every enqueue would write it (bulk enqueue
# 10-30 % slower here). ``manage.py jobq_search_index`` creates it where payload search over
# every job is worth that (docs/admin.md, "Finding jobs"). The error's index is partial
# (failed and retried rows only): an enqueue never writes it.
TRIGRAM_INDEXES = (
    (
        "jobq_job_error_trgm",
        "CREATE INDEX IF NOT EXISTS jobq_job_error_trgm ON django_jobq_job USING gin "
        "((left(coalesce(error->>'type', '') || ': ' || coalesce(error->>'message', '') "
        "|| ' ' || coalesce(error->>'traceback', ''), 1000)) gin_trgm_ops) "
        "WHERE error IS NOT NULL",
    ),
)
# The planner's statistics of the two searched texts (PostgreSQL 14+): without them it takes
# any ``ILIKE '%term%'`` for a rare match and reads every matching row through the trigram
# index before sorting (0.5 s for "ValueError" over 80,000 failed jobs), where the list's
# creation-time index finds the newest 100 in 11 ms.
STATISTICS = (
    (
        "jobq_job_error_text",
        "CREATE STATISTICS IF NOT EXISTS jobq_job_error_text ON "
        "(left(coalesce(error->>'type', '') || ': ' || coalesce(error->>'message', '') "
        "|| ' ' || coalesce(error->>'traceback', ''), 1000)) FROM django_jobq_job",
    ),
)


def create_trigram_indexes(apps, schema_editor):
    """PostgreSQL only; without ``pg_trgm`` (not installed, or not allowed) nothing."""
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError:
        return
    for _, sql in TRIGRAM_INDEXES:
        schema_editor.execute(sql)
    if schema_editor.connection.pg_version >= 140000:
        for _, sql in STATISTICS:
            schema_editor.execute(sql)


def drop_trigram_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, _ in TRIGRAM_INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
        for name, _ in STATISTICS:
            schema_editor.execute(f"DROP STATISTICS IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0028_jobminute_totals"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["handler", "created_at", "id"],
                name="jobq_job_handler",
                opclasses=["varchar_pattern_ops", "timestamptz_ops", "int8_ops"],
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["state", "created_at", "id"], name="jobq_job_state_created"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["queue", "finished_at", "id"],
                name="jobq_job_q_done_id",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["state", "finished_at", "id"],
                name="jobq_job_state_done_id",
            ),
        ),
        migrations.RunPython(create_trigram_indexes, drop_trigram_indexes),
    ]
