"""``manage.py check`` reports a bad JOBQ setting before any worker starts."""

from django.core import checks

from .backend import check_settings


@checks.register()
def jobq_settings_check(app_configs, **kwargs):
    return [
        checks.Error(problem, hint="See docs/settings.md.", id="django_jobq.E001")
        for problem in check_settings()
    ]


@checks.register()
def schedules_settings_check(app_configs, **kwargs):
    """A bad ``JOBQ["SCHEDULES"]`` entry (bad cron, unknown task, arguments that do not bind,
    NaN in a payload) is refused here, before deploy, and the reaper syncs nothing while one
    is there."""
    from .schedules.sync import check_declared

    try:
        problems = check_declared()
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    return [
        checks.Error(problem, hint="See docs/schedules.md.", id="django_jobq.E002")
        for problem in problems
    ]


@checks.register()
def mirror_sqlite_check(app_configs, **kwargs):
    """The Redis mirror commits to SQLite several times a second. A deferred transaction of
    the project's own that reads, then writes (``update_or_create``, ``get_or_create``,
    ``select_for_update``) fails at once with "database is locked" when any other connection
    committed in between: SQLite cannot wait there, whatever the busy timeout. Immediate
    transactions take the write lock first and wait on the timeout instead."""
    from django.conf import settings

    from .conf import jobq_settings

    try:
        conf = jobq_settings()
    except Exception:  # a bad JOBQ setting is reported by jobq_settings_check
        return []
    alias = conf["MIRROR"]["DATABASE_ALIAS"]
    db = settings.DATABASES.get(alias, {})
    mode = str(db.get("OPTIONS", {}).get("transaction_mode") or "").upper()
    if conf["BACKEND"] != "redis" or not conf["MIRROR"]["ENABLED"]:
        return []
    if "sqlite3" not in db.get("ENGINE", "") or mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is SQLite and the Redis mirror writes to it: the project's "
            "own transactions that read before they write can fail with 'database is locked' "
            "while the mirror commits.",
            hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" (and '
            'a "timeout"), or point JOBQ["MIRROR"]["DATABASE_ALIAS"] at PostgreSQL. See '
            "docs/admin.md.",
            id="django_jobq.W001",
        )
    ]
