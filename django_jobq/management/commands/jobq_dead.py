"""The dead-letter list from the shell: what failed for good, why, and putting it back to work
once the cause is fixed. Every action is a Queue API call (one atomic storage step per job)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...errors import JobQError
from ...job import DeadLetter
from ...queue.core import Queue


def _line(dead: DeadLetter) -> dict[str, Any]:
    status, error = dead.status, dead.error or {}
    return {
        "id": dead.job_id,
        "failed_at": status.finished_at.isoformat() if status.finished_at else None,
        "attempts": status.attempts,
        "stalls": status.stalls,
        "error": f"{error.get('type', '?')}: {error.get('message', '')}",
    }


class Command(BaseCommand):
    help = "List, inspect, retry and purge a queue's dead letters (jobs that failed for good)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="one JSON line per dead letter, newest first")
        listing.add_argument("queue")
        listing.add_argument("--offset", type=int, default=0)
        listing.add_argument("--limit", type=int, default=100)
        show = sub.add_parser("show", help="one job: payload, error with traceback, attempts")
        show.add_argument("queue")
        show.add_argument("job_id")
        for name, text in (
            ("retry", "queue failed (or cancelled) jobs again, from attempt 1"),
            ("purge", "delete dead letters; their ids can be enqueued again"),
        ):
            cmd = sub.add_parser(name, help=text)
            cmd.add_argument("queue")
            cmd.add_argument("job_ids", nargs="*", metavar="job_id")
            cmd.add_argument("--all", action="store_true", help="every dead letter of the queue")
        sub.choices["purge"].add_argument("--yes", action="store_true", help="do not ask")
        calls = sub.add_parser(
            "calls", help="failure-handler calls not done yet, soonest due first (JSON lines)"
        )
        calls.add_argument("queue")
        calls.add_argument("--offset", type=int, default=0)
        calls.add_argument("--limit", type=int, default=100)

    def handle(self, *args, action: str, **options):
        try:
            getattr(self, f"do_{action}")(**options)
        except JobQError as exc:
            raise CommandError(str(exc)) from exc

    def do_list(self, queue, offset, limit, **_):
        q = Queue(queue)
        for dead in q.dead_letters(offset=offset, limit=limit):
            self.stdout.write(json.dumps(_line(dead)))
        self.stderr.write(
            f"{queue}: {q.count_dead()} dead letter(s),"
            f" {q.count_failure_calls()} failure-handler call(s) pending"
        )

    def do_calls(self, queue, offset, limit, **_):
        q = Queue(queue)
        for call in q.failure_calls(offset=offset, limit=limit):
            error, last = call.error or {}, call.last_error
            line = {
                "id": call.job_id,
                "failed_at": call.failed_at.isoformat(),
                "due_at": call.due_at.isoformat(),
                "tries": call.tries,
                "worker": call.worker,
                "error": f"{error.get('type', '?')}: {error.get('message', '')}",
                "last_error": f"{last.get('type', '?')}: {last.get('message', '')}"
                if last
                else None,
            }
            self.stdout.write(json.dumps(line))
        self.stderr.write(f"{queue}: {q.count_failure_calls()} failure-handler call(s) pending")

    def do_show(self, queue, job_id, **_):
        q = Queue(queue)
        status = q.get_status(job_id)
        if status is None:
            raise CommandError(f"{queue}/{job_id}: no such job (or its record expired)")
        payload = q.get_payload(job_id)
        body = {
            **_line(DeadLetter(status, payload)),
            "state": status.state.value,
            "payload": payload if not isinstance(payload, bytes) else repr(payload),
            "traceback": (status.error or {}).get("traceback"),
        }
        self.stdout.write(json.dumps(body, indent=2, default=str))

    def _targets(self, job_ids: list[str], every: bool) -> list[str] | None:
        if every == bool(job_ids):
            raise CommandError("name job ids or give --all (not both)")
        return None if every else job_ids

    def do_retry(self, queue, job_ids, all, **_):  # noqa: A002 - the option's name
        q = Queue(queue)
        targets = self._targets(job_ids, all)
        if targets is None:
            self.stdout.write(f"{queue}: {q.retry_dead()} job(s) queued again")
            return
        for job_id, outcome in q.retry_many(targets).items():
            self.stdout.write(f"{queue}/{job_id}: {outcome.value}")

    def do_purge(self, queue, job_ids, all, yes, **_):  # noqa: A002 - the option's name
        q = Queue(queue)
        targets = self._targets(job_ids, all)
        if targets is None and not yes:
            answer = input(f"Delete all {q.count_dead()} dead letters of {queue!r}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("not confirmed; nothing deleted")
        self.stdout.write(f"{queue}: deleted {q.purge_dead(targets)} dead letter(s)")
