from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError

from ...broadcast.subscribers import SubscriberWorker
from ...conf import jobq_settings
from ...errors import JobQError
from ...observability.logs import configure
from ...tasks.registry import registry
from ...worker import stopsignals
from ...worker.core import Worker
from ...worker.pools import POOLS

if TYPE_CHECKING:
    from ...contrib.celery.bridge import KombuBridge

logger = logging.getLogger("django_jobq.worker")


def _min_max(text: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX (two integers), got {text!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return low, high


class Command(BaseCommand):
    help = "Run a django_jobq worker: claim jobs from the given queues and run their handlers."
    # Django's system checks import the whole URLconf (admin, REST framework, ...): 0.4-0.6 s of
    # a worker's start-up in a typical project, paid by every autoscaled or restarted worker
    # before its first job. Deploys run `manage.py check` once; `--check` runs them here too.
    # The worker's own configuration check (Worker.check) always runs.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queues to serve (default: all handlers')")
        parser.add_argument("--concurrency", "-c", type=int, help="jobs in flight at once")
        parser.add_argument("--lease", type=int, help="lease (visibility timeout) in ms")
        parser.add_argument(
            "--failure-lease", type=int, help="lease of a failure-handler call in ms"
        )
        parser.add_argument("--grace", type=float, help="seconds to finish jobs on SIGTERM")
        parser.add_argument("--batch", type=int, help="max jobs per claim")
        parser.add_argument(
            "--pool",
            choices=POOLS,
            default="thread",
            help="where handlers (and subscribers) run: thread (default, I/O-bound), process "
            "(CPU-bound, hard timeouts; one reused child process per slot) or async (async def "
            "handlers)",
        )
        parser.add_argument(
            "--autoscale",
            type=_min_max,
            metavar="MIN,MAX",
            help="move the number of jobs in flight between MIN and MAX from measured CPU use, "
            "slot use and handler latency (overrides --concurrency)",
        )
        parser.add_argument(
            "--processes",
            "-p",
            type=int,
            default=1,
            help="fork this many worker processes after setting Django up once, and supervise "
            "them (a dead one is replaced; SIGTERM stops them all gracefully); each has its "
            "own worker id, leases and --concurrency slots (default 1: this process serves)",
        )
        parser.add_argument(
            "--worker-id",
            help="stable id (default: host-pid-random; with --processes, suffixed -0, -1, ...)",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="run Django's system checks before starting (off by default: they import the "
            "URLconf and slow the start-up; run `manage.py check` at deploy instead)",
        )
        parser.add_argument(
            "--reap-interval", type=float, help="seconds between own stalled-job sweeps (0: off)"
        )
        parser.add_argument(
            "--subscriber",
            action="append",
            metavar="NAME[:GROUP]",
            help="also run the @subscriber handlers of this broadcast (every group registered "
            "here) or of one group; repeatable (default: all of them when no queue is given)",
        )
        parser.add_argument(
            "--log-format",
            choices=("text", "json"),
            default="text",
            help="json: one JSON object per log line, with job id, queue, attempt, worker and "
            "trace id on lines about a job (when the project's LOGGING sets no handler)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="serve this worker's Prometheus metrics on PORT (0: any free port, logged); "
            "needs the 'metrics' extra; one port per worker process",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="address of the metrics endpoint (default 127.0.0.1; 0.0.0.0 to be scraped "
            "from other hosts)",
        )
        parser.add_argument(
            "--from-kombu",
            metavar="BROKER_URL",
            help="also bridge Celery task messages from this kombu broker into django_jobq "
            "(default: JOBQ['CELERY']['BROKER_URL'] when CONSUME_QUEUES is set)",
        )
        parser.add_argument(
            "--celery-queue",
            action="append",
            metavar="NAME",
            help="Celery queue the bridge consumes (repeatable; default: CONSUME_QUEUES or "
            "'celery')",
        )

    def handle(self, *args, **options):
        configure(options["verbosity"], options["log_format"])
        if options["check"]:
            self.check()
        if options["processes"] != 1:
            return self._prefork(options)
        return self._serve(options)

    def _prefork(self, options: dict[str, Any]) -> None:
        """``--processes N``: everything a worker imports is imported here, once (the
        handlers' modules, the storage backend), the configuration is checked once, then N
        children are forked (``prefork.py``), each serving as a single ``runworker`` would."""
        from django.db import connections

        from ...backend import get_storage, reset_storage
        from ...worker.prefork import Prefork

        processes = options["processes"]
        if processes < 1:
            raise CommandError(f"--processes must be at least 1, got {processes}")
        queues = options["queues"] or ([] if options["subscriber"] else registry.queues())
        # Refuse a bad configuration before forking, not N times after (each child in a loop).
        subs = self._subscribers(options)  # also imports what each child's _serve imports
        if queues:
            worker = self._worker(queues, dict(options, worker_id=None))
            self._warn_connections(worker.concurrency, processes)
        elif subs is None:
            raise CommandError("no queues given and no handlers registered (jobs.py modules)")
        get_storage()  # imports the backend's client library in the parent

        # No connection may cross the fork: each child opens its own.
        reset_storage()
        connections.close_all()
        base_id, port = options["worker_id"], options["metrics_port"]

        def serve(index: int) -> int:
            reset_storage()  # the parent's (never connected) storage object stays unused
            child = dict(options, processes=1, budget_checked=True)
            if base_id:
                child["worker_id"] = f"{base_id[:120]}-{index}"
            if port:  # one endpoint per process: PORT, PORT+1, ...
                child["metrics_port"] = port + index
            self._serve(child)
            return 0

        status = Prefork(processes, serve).run()
        if status:
            raise CommandError("a worker process did not stop cleanly (see the log above)")

    def _warn_connections(self, concurrency: int, processes: int) -> None:
        """Say at start, not at the first "too many clients", when the handler threads of
        every process could take more connections than a database server allows."""
        from ...checks import connection_budget

        for problem in connection_budget(concurrency, processes):
            logger.warning(
                "%s: lower --concurrency or --processes, use Django's connection pool "
                "(OPTIONS['pool']) or raise the server's max_connections (docs/workers.md)",
                problem,
            )

    def _worker(self, queues: list[str], options: dict[str, Any]) -> Worker:
        try:
            worker = Worker(
                queues,
                concurrency=options["concurrency"],
                lease=options["lease"],
                grace=options["grace"],
                batch=options["batch"],
                worker_id=options["worker_id"],
                reap_interval=options["reap_interval"],
                pool=options["pool"],
                autoscale=options["autoscale"],
                failure_lease=options["failure_lease"],
            )
            worker.check()
        except JobQError as exc:
            raise CommandError(str(exc)) from exc
        return worker

    def _serve(self, options: dict[str, Any]) -> None:
        # Only --subscriber given: a subscriber worker (no queues unless named too).
        queues = options["queues"] or ([] if options["subscriber"] else registry.queues())
        subs = self._subscribers(options)
        if not queues:  # subscribers only
            if subs is None:
                raise CommandError("no queues given and no handlers registered (jobs.py modules)")
            return self._serve_subscribers(subs, options)
        if subs is not None and options["worker_id"]:
            # Both in one process: two registrations, so two ids (one would hide the other).
            subs.worker_id = f"{subs.worker_id[:116]}-subscribers"
        worker = self._worker(queues, options)
        if not options.get("budget_checked"):
            self._warn_connections(worker.concurrency, 1)
        bridge = self._bridge(options, worker)
        metrics_server = self._metrics(worker, options)

        def on_signal(signum: int) -> None:
            # First signal: graceful (finish in-flight within grace). Second: hurry. The bridge
            # stops taking messages at once; what it prefetched and did not store goes back to
            # the broker unacknowledged when its connection closes. Runs on the relay thread
            # (stopsignals.py: a stop run by the handler itself could be lost or deadlock).
            if bridge is not None:
                bridge.stop()
            if subs is not None:
                subs.stop(hurry=subs.stopping)
            worker.stop(hurry=worker.stopping)

        with stopsignals.relayed(on_signal):
            thread = None
            if bridge is not None:
                from ...contrib.celery.bridge import bridge_thread

                thread = bridge_thread(bridge)
            subs_thread = subs.start() if subs is not None else None
            try:
                worker.run()
            finally:
                if subs is not None and subs_thread is not None:
                    subs.stop()
                    subs_thread.join(subs.grace + 10)
                if bridge is not None and thread is not None:
                    bridge.stop()
                    thread.join(10)
                if metrics_server is not None:
                    metrics_server.shutdown()

    def _subscribers(self, options) -> SubscriberWorker | None:
        """The broadcast subscribers to run: those named by --subscriber, else every one
        registered when no queue was named, else none."""
        from ...broadcast.core import subscribers

        try:
            if options["subscriber"]:
                chosen = subscribers.select(options["subscriber"])
            else:
                chosen = [] if options["queues"] else subscribers.all()
            if not chosen:
                return None
            return SubscriberWorker(
                chosen,
                concurrency=options["concurrency"],
                lease=options["lease"],
                grace=options["grace"],
                worker_id=options["worker_id"],
                pool=options["pool"],
            )
        except JobQError as exc:
            raise CommandError(str(exc)) from exc

    def _metrics(self, worker: Worker | SubscriberWorker, options) -> Any:
        """The ``--metrics-port`` endpoint of this process's worker, or None."""
        if options["metrics_port"] is None:
            return None
        from ...observability.metrics.server import serve

        try:
            return serve(worker, options["metrics_port"], options["metrics_addr"])
        except (JobQError, OSError) as exc:
            raise CommandError(f"metrics endpoint: {exc}") from exc

    def _serve_subscribers(self, subs: SubscriberWorker, options) -> None:
        metrics_server = self._metrics(subs, options)

        def on_signal(signum: int) -> None:
            subs.stop(hurry=subs.stopping)

        with stopsignals.relayed(on_signal):
            try:
                subs.run()
            finally:
                if metrics_server is not None:
                    metrics_server.shutdown()

    def _bridge(self, options, worker: Worker) -> KombuBridge | None:
        conf = jobq_settings()["CELERY"]
        url = options["from_kombu"] or (conf["BROKER_URL"] if conf["CONSUME_QUEUES"] else None)
        if not url:
            if options["celery_queue"]:
                raise CommandError("--celery-queue needs --from-kombu (or CELERY BROKER_URL)")
            return None
        queues = options["celery_queue"] or conf["CONSUME_QUEUES"] or ["celery"]
        # kombu is imported only by workers that bridge: the others start without it.
        from ...contrib.celery.bridge import KombuBridge

        return KombuBridge(url, queues, storage=worker.storage)
