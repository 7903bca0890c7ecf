"""``runworker --metrics-port``: this worker process's own metrics over HTTP.

One endpoint per worker process (multi-process safe by construction: nothing is shared, so no
prometheus multiprocess directory to set up and clean). The process pool's children need none:
jobs are claimed and their verdicts sent, and so counted, in the worker process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import install, prometheus
from .broadcasts import DeliveryCollector
from .collectors import TallyCollector, WorkerCollector

if TYPE_CHECKING:
    from ...broadcast.subscribers import SubscriberWorker
    from ...worker.core import Worker

logger = logging.getLogger("django_jobq.metrics")


def serve(worker: Worker | SubscriberWorker, port: int, addr: str = "127.0.0.1") -> Any:
    """Start serving ``worker``'s metrics on ``addr:port`` (port 0: any free port) in a
    daemon thread; returns the HTTP server (``server_port``; ``shutdown()`` to stop)."""
    p = prometheus()
    registry = p.CollectorRegistry(auto_describe=False)
    counted = install()
    registry.register(TallyCollector(counted))
    registry.register(DeliveryCollector(counted))
    registry.register(WorkerCollector(worker))
    server, _thread = p.start_http_server(port, addr=addr, registry=registry)
    logger.info("worker %s metrics on http://%s:%d/metrics", worker.worker_id, addr,
                server.server_port)  # fmt: skip
    return server
