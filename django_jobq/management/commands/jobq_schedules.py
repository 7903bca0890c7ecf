import datetime as dt

from django.core.management.base import BaseCommand, CommandError

from ...backend import get_storage
from ...models import Schedule
from ...schedules.core import describe, fire_now, first_run, next_tick, schedules_alias, zone


class Command(BaseCommand):
    help = (
        "List periodic schedules with their next run (in each schedule's time zone), run one"
        " now with --fire-now, or sync JOBQ['SCHEDULES'] to rows with --sync."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--fire-now",
            metavar="NAME",
            help="enqueue one extra run of this schedule now (id schedule.<name>.manual-<ms>)",
        )
        parser.add_argument(
            "--upcoming",
            type=int,
            default=1,
            metavar="N",
            help="show the next N runs of each schedule (default 1)",
        )
        parser.add_argument(
            "--queue",
            help="with --fire-now: the schedule's queue (names are unique per queue)",
        )
        parser.add_argument(
            "--sync",
            action="store_true",
            help="sync JOBQ['SCHEDULES'] to schedule rows (create, update, delete settings"
            " rows; rows made in the admin are left alone), as the reaper does",
        )
        parser.add_argument(
            "--database",
            help="database alias of the schedules (default: the one the reaper reads)",
        )

    def handle(self, *args, **options):
        storage = get_storage()
        using = options["database"] or schedules_alias(storage)
        if options["sync"]:
            from ...errors import ConfigurationError
            from ...schedules.sync import sync

            try:
                report = sync(using=using)
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"synced: {report}")
            if report.conflicts:
                self.stderr.write(
                    "conflicts: declared schedules whose queue/name belongs to a schedule made "
                    f"in the admin (not applied): {', '.join(report.conflicts)}"
                )
            return
        if options["fire_now"]:
            name = options["fire_now"]
            found = Schedule.objects.using(using).filter(name=name)
            if options["queue"]:
                found = found.filter(queue=options["queue"])
            schedules = list(found[:2])
            if not schedules:
                raise CommandError(f"no schedule named {name!r}")
            if len(schedules) > 1:
                raise CommandError(f"schedules named {name!r} exist on several queues: add --queue")
            schedule = schedules[0]
            result = fire_now(schedule, storage=storage, using=using)
            self.stdout.write(f"{schedule.queue}/{result.job_id}: {result.outcome.value}")
            return
        if options["upcoming"] < 1:
            raise CommandError("--upcoming must be at least 1")
        schedules = list(Schedule.objects.using(using).order_by("name"))
        if not schedules:
            self.stdout.write("no schedules")
            return
        now = dt.datetime.now(dt.UTC)
        rows = [
            ("NAME", "QUEUE", "WHEN", "TIMEZONE", "ENABLED", "NEXT RUN", "LAST RUN", "LAST JOB")
        ]
        for schedule in schedules:
            runs = self._upcoming(schedule, now, options["upcoming"])
            rows.append(
                (
                    schedule.name,
                    schedule.queue,
                    describe(schedule),
                    schedule.timezone,
                    "yes" if schedule.enabled else "no",
                    runs[0],
                    self._local(schedule, schedule.last_run_at),
                    schedule.last_job_id or "-",
                )
            )
            rows.extend(("", "", "", "", "", run, "", "") for run in runs[1:])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )

    def _upcoming(self, schedule: Schedule, now: dt.datetime, count: int) -> list[str]:
        try:
            tick = schedule.next_run_at or first_run(schedule, now)
            ticks = [tick]
            for _ in range(count - 1):
                tick = next_tick(schedule, tick)
                ticks.append(tick)
        except ValueError as exc:
            return [f"invalid: {exc}"]
        shown = [self._local(schedule, t) for t in ticks]
        if ticks[0] <= now and schedule.enabled:
            shown[0] += " (due)"  # no reaper has fired it yet
        return shown

    @staticmethod
    def _local(schedule: Schedule, at: dt.datetime | None) -> str:
        if at is None:
            return "-"
        try:
            return at.astimezone(zone(schedule.timezone)).isoformat()
        except ValueError:
            return at.isoformat()
