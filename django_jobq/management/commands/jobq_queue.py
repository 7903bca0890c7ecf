"""Queue control from the shell, for operators without the admin at hand (deploy scripts,
incidents): the same storage calls the Queue API makes, one atomic step each."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from ...errors import JobQError
from ...queue.core import Queue


class Command(BaseCommand):
    help = (
        "Inspect and control queues: status, pause, resume, drain, clean, obliterate, limits, "
        "retention, promote."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        status = sub.add_parser("status", help="counts, paused flag and limits per queue")
        status.add_argument("queues", nargs="*", help="default: every known queue")
        for name, text in (("pause", "stop workers claiming"), ("resume", "undo pause")):
            sub.add_parser(name, help=text).add_argument("queue")
        drain = sub.add_parser("drain", help="cancel every waiting job")
        drain.add_argument("queue")
        drain.add_argument("--queued-only", action="store_true", help="keep scheduled jobs")
        clean = sub.add_parser("clean", help="delete finished jobs older than --older-than")
        clean.add_argument("queue")
        clean.add_argument("--older-than", type=float, required=True, metavar="SECONDS")
        clean.add_argument(
            "--state", action="append", choices=["completed", "failed", "cancelled"],
            help="repeatable (default: all three)",
        )  # fmt: skip
        clean.add_argument("--limit", type=int, default=10_000)
        obliterate = sub.add_parser("obliterate", help="delete the queue and all its jobs")
        obliterate.add_argument("queue")
        obliterate.add_argument("--force", action="store_true", help="even with active jobs")
        obliterate.add_argument("--yes", action="store_true", help="do not ask")
        limits = sub.add_parser("limits", help="show or set flow-control limits")
        limits.add_argument("queue")
        limits.add_argument("--rate-max", type=int)
        limits.add_argument("--rate-window", type=int, metavar="MS")
        limits.add_argument("--group-rate-max", type=int)
        limits.add_argument("--group-rate-window", type=int, metavar="MS")
        limits.add_argument("--concurrency", type=int)
        limits.add_argument("--clear", action="store_true", help="remove every limit")
        retention = sub.add_parser(
            "retention", help="show or set the retention of finished jobs (count and/or age)"
        )
        retention.add_argument("queue")
        for state in STATES:
            retention.add_argument(f"--{state}-count", type=int, metavar="N")
            retention.add_argument(f"--{state}-age", type=int, metavar="MS")
        retention.add_argument("--clear", action="store_true", help="remove the whole policy")
        promote = sub.add_parser("promote", help="run a scheduled job now")
        promote.add_argument("queue")
        promote.add_argument("job_id")

    def handle(self, *args, action: str, **options):
        try:
            getattr(self, f"do_{action}")(**options)
        except JobQError as exc:
            raise CommandError(str(exc)) from exc

    def do_status(self, queues, **_):
        probe = Queue("default")
        names = queues or probe.storage.list_queues()
        for name in names:
            q = Queue(name, storage=probe.storage)
            counts = {state.value: n for state, n in q.counts().items()}
            limits = {k: v for k, v in vars_of(q.get_limits()).items() if v is not None}
            self.stdout.write(
                json.dumps(
                    {
                        "queue": name,
                        "paused": q.is_paused(),
                        "counts": counts,
                        "limits": limits,
                        "retention": policy_dict(q.get_retention()),
                    }
                )  # fmt: skip
            )

    def do_pause(self, queue, **_):
        Queue(queue).pause()
        self.stdout.write(f"{queue}: paused (enqueues still accepted)")

    def do_resume(self, queue, **_):
        Queue(queue).resume()
        self.stdout.write(f"{queue}: resumed")

    def do_drain(self, queue, queued_only, **_):
        n = Queue(queue).drain(delayed=not queued_only)
        self.stdout.write(f"{queue}: cancelled {n} waiting jobs")

    def do_clean(self, queue, older_than, state, limit, **_):
        kwargs = {"states": state} if state else {}
        n = Queue(queue).clean(int(older_than * 1000), limit=limit, **kwargs)
        self.stdout.write(f"{queue}: deleted {n} finished jobs")

    def do_obliterate(self, queue, force, yes, **_):
        if not yes:
            answer = input(f"Delete queue {queue!r} and every job in it? Type the name: ")
            if answer.strip() != queue:
                raise CommandError("not confirmed; nothing deleted")
        n = Queue(queue).obliterate(force=force)
        self.stdout.write(f"{queue}: obliterated ({n} jobs deleted)")

    def do_limits(self, queue, clear, **options):
        q = Queue(queue)
        wanted = {
            k: options[k]
            for k in (
                "rate_max",
                "rate_window",
                "group_rate_max",
                "group_rate_window",
                "concurrency",
            )  # fmt: skip
            if options.get(k) is not None
        }
        if clear:
            q.set_limits(**wanted)
        elif wanted:  # the limits not named stay as they are
            current = {k: v for k, v in vars_of(q.get_limits()).items() if v is not None}
            q.set_limits(**{**current, **wanted})
        limits = {k: v for k, v in vars_of(q.get_limits()).items() if v is not None}
        self.stdout.write(json.dumps({"queue": queue, "limits": limits}))

    def do_retention(self, queue, clear, **options):
        """States named on the command line are replaced (both bounds of a state: give both
        to keep both); the others keep their policy; ``--clear`` first removes all."""
        q = Queue(queue)
        policy = {} if clear else policy_dict(q.get_retention())
        for state in STATES:
            count, age = options.get(f"{state}_count"), options.get(f"{state}_age")
            if count is not None or age is not None:
                policy[state] = {k: v for k, v in (("count", count), ("age", age)) if v is not None}
        if clear or any(options.get(f"{s}_{b}") is not None for s in STATES
                        for b in ("count", "age")):  # fmt: skip
            q.set_retention(policy or None)
        self.stdout.write(json.dumps({"queue": queue, "retention": policy_dict(q.get_retention())}))

    def do_promote(self, queue, job_id, **_):
        self.stdout.write(f"{queue}/{job_id}: {Queue(queue).promote(job_id).value}")


STATES = ("completed", "failed", "cancelled")


def policy_dict(retention) -> dict:
    """A ``Retention`` in the settings' shape, bounds that are None left out."""
    return {
        state: {k: v for k, v in (("count", keep.count), ("age", keep.age)) if v is not None}
        for state, keep in retention.items()
        if keep is not None
    }


def vars_of(limits) -> dict:
    return {name: getattr(limits, name) for name in limits.__dataclass_fields__}
