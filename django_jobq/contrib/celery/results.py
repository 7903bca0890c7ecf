"""Results of Celery-started jobs written where Celery's Redis result backend reads them.

Why Redis's format: ``AsyncResult(id).get()`` of a Celery app whose ``result_backend`` is
``redis://…`` reads the key ``celery-task-meta-<id>`` (a JSON meta document) and is woken by a
PUBLISH on the channel of the same name. Writing that key, in that shape, lets code that still
holds Celery ``AsyncResult`` objects read results of tasks that django_jobq ran, so a queue can
move without changing its callers. Other Celery result backends (database, RPC) are not
written; docs/migrating-from-celery.md says what to use instead.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import traceback
from typing import Any

from kombu.utils.json import dumps as kombu_dumps

from ...storage.redis.connection import client_from_url

KEY_PREFIX = "celery-task-meta-"
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def _client(url: str) -> Any:
    """One client (and pool) per result-backend URL, with the retry and timeout policy of our
    own Redis connections."""
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = client_from_url(url)
        return client


def _exception_info(exc: BaseException) -> dict[str, Any]:
    """Celery's JSON form of an exception (type, module, args), which ``AsyncResult.get``
    turns back into an exception of the same name."""
    kind = type(exc)
    try:
        json.dumps(exc.args)
        message: Any = list(exc.args)
    except (TypeError, ValueError):
        message = [str(exc)]
    return {"exc_type": kind.__qualname__, "exc_message": message, "exc_module": kind.__module__}


class CeleryResultWriter:
    """Stores SUCCESS / FAILURE meta documents for Celery task ids in a Redis result backend."""

    def __init__(self, url: str, *, expires: int = 86400, key_prefix: str = "") -> None:
        self.url = url
        self.expires = expires
        self.key_prefix = key_prefix  # Celery's result_backend_transport_options global_keyprefix

    def key(self, task_id: str) -> str:
        return f"{self.key_prefix}{KEY_PREFIX}{task_id}"

    def _store(self, task_id: str, meta: dict[str, Any]) -> None:
        value = kombu_dumps(meta)
        key = self.key(task_id)
        pipe = _client(self.url).pipeline(transaction=False)
        pipe.set(key, value, ex=self.expires)
        pipe.publish(key, value)
        pipe.execute()

    def _meta(self, task_id: str, status: str, result: Any, tb: str | None, request: dict) -> dict:
        meta: dict[str, Any] = {
            "status": status,
            "result": result,
            "traceback": tb,
            "children": [],
            "date_done": dt.datetime.now(dt.UTC).isoformat(),
            "task_id": task_id,
        }
        if request.get("group"):
            meta["group_id"] = request["group"]
        if request.get("parent_id"):
            meta["parent_id"] = request["parent_id"]
        return meta

    def success(self, request: dict[str, Any], result: Any) -> None:
        task_id = request["id"]
        self._store(task_id, self._meta(task_id, "SUCCESS", result, None, request))

    def failure(self, request: dict[str, Any], exc: BaseException) -> None:
        task_id = request["id"]
        tb = "".join(traceback.format_exception(exc))
        self._store(task_id, self._meta(task_id, "FAILURE", _exception_info(exc), tb, request))
