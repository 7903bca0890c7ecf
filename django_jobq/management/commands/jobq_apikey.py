"""``manage.py jobq_apikey create|list|revoke``: API keys of the REST API (docs/api.md)."""

from django.core.management.base import BaseCommand, CommandError

from ...api.keys import ACTIONS, create_key, revoke
from ...errors import InvalidQueueName
from ...models import ApiKey
from ...validation import validate_queue_name


class Command(BaseCommand):
    help = "Create, list or revoke API keys of the django_jobq REST API."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print it (shown only once)")
        create.add_argument("name", help="who or what uses the key")
        create.add_argument(
            "--queue", action="append", dest="queues", required=True, metavar="QUEUE",
            help='a queue the key may touch (repeat for several; "*" for every queue)',
        )  # fmt: skip
        create.add_argument(
            "--action", action="append", dest="actions", required=True, choices=ACTIONS,
            help="an action the key may do (repeat for several)",
        )  # fmt: skip
        create.add_argument("--throttle", default="", help='request rate, e.g. "100/min"')
        sub.add_parser("list", help="list keys (never their secrets)")
        rev = sub.add_parser("revoke", help="revoke a key by its prefix")
        rev.add_argument("prefix")

    def handle(self, *args, **options):
        getattr(self, f"_{options['action']}")(options)

    def _create(self, options):
        queues = options["queues"]
        try:
            for queue in queues:
                if queue != "*":
                    validate_queue_name(queue)
            key, raw = create_key(
                options["name"], queues=queues, actions=options["actions"],
                throttle_rate=options["throttle"],
            )  # fmt: skip
        except (ValueError, InvalidQueueName) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
        self.stderr.write(
            f"key {key.prefix} ({key.name}): queues {key.queues}, actions {key.actions}."
            " Store it now: only its hash is kept."
        )

    def _list(self, options):
        rows = [("PREFIX", "NAME", "QUEUES", "ACTIONS", "THROTTLE", "LAST USED", "REVOKED")]
        for key in ApiKey.objects.order_by("created_at"):
            rows.append((
                key.prefix, key.name, ",".join(key.queues), ",".join(key.actions),
                key.throttle_rate or "-", _when(key.last_used_at), _when(key.revoked_at),
            ))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))

    def _revoke(self, options):
        key = ApiKey.objects.filter(prefix=options["prefix"]).first()
        if key is None:
            raise CommandError(f"no API key with prefix {options['prefix']!r}")
        revoke(key)
        self.stdout.write(f"revoked {key.prefix} ({key.name})")


def _when(value):
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M")
