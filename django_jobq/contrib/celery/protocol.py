"""Celery task messages (protocol v2, and v1 for old producers), read and written with kombu's
JSON so that what a Celery client sends and what a Celery worker expects round-trip exactly.

Only JSON bodies are accepted: a pickled message is refused *before* it is decoded (decoding
pickle is running the sender's code).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from ...errors import InvalidJobId, JobQError, ValidationError
from ...validation import validate_job_id

JSON_TYPES = ("application/json",)


class MalformedMessage(JobQError):
    """A broker message that is not a Celery task message we can run (kept, never run)."""


@dataclass
class CeleryTask:
    """One Celery task request, whatever protocol version carried it."""

    task: str
    id: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    eta: dt.datetime | None = None
    expires: dt.datetime | None = None
    retries: int = 0
    root_id: str | None = None
    parent_id: str | None = None
    group: str | None = None

    @property
    def job_id(self) -> str:
        return job_id_for(self.id)

    def meta(self) -> dict[str, Any]:
        """What the job payload keeps of the request besides its arguments."""
        out: dict[str, Any] = {"id": self.id, "task": self.task, "retries": self.retries}
        for name in ("root_id", "parent_id", "group"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.expires is not None:
            out["expires"] = self.expires.isoformat()
        return out


def job_id_for(task_id: str) -> str:
    """Celery's id when it fits our id charset (uuid4 ids always do), else a stable digest of
    it, so a redelivered message still deduplicates."""
    try:
        return validate_job_id(task_id)
    except InvalidJobId:
        return "celery-" + hashlib.sha256(task_id.encode()).hexdigest()[:40]


def _when(value: Any, field_name: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise MalformedMessage(f"{field_name} {value!r} is not an ISO 8601 time") from exc
    else:
        raise MalformedMessage(f"{field_name} {value!r} is not an ISO 8601 time")
    # Celery sends naive times in UTC unless told otherwise (enable_utc is the default).
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def parse(
    body: bytes | str, headers: dict[str, Any] | None, content_type: str | None
) -> CeleryTask:
    """The task in one message, or ``MalformedMessage`` saying why it cannot be run."""
    if (content_type or "").split(";")[0].strip() not in JSON_TYPES:
        raise MalformedMessage(f"content type {content_type!r} refused: only JSON is accepted")
    try:
        decoded = kombu_loads(body.decode() if isinstance(body, bytes) else body)
    except RecursionError:
        # Not a storage failure: left to the bridge's catch-all, the message would be
        # requeued and redelivered forever.
        raise MalformedMessage("body is JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"body is not valid JSON: {exc}") from exc
    headers = dict(headers or {})
    if "task" in headers:  # protocol v2: the request is in the headers, arguments in the body
        if not (isinstance(decoded, list | tuple) and len(decoded) == 3):
            raise MalformedMessage("protocol 2 body must be [args, kwargs, embed]")
        args, kwargs, _embed = decoded
        fields = headers
    elif isinstance(decoded, dict) and "task" in decoded:  # protocol v1: all in the body
        args, kwargs, fields = decoded.get("args", []), decoded.get("kwargs", {}), decoded
    else:
        raise MalformedMessage("no task name in the headers (v2) or the body (v1)")
    task, task_id = fields.get("task"), fields.get("id")
    if not isinstance(task, str) or not task:
        raise MalformedMessage(f"task name {task!r} is not a string")
    if not isinstance(task_id, str) or not task_id or len(task_id) > 255:
        raise MalformedMessage(f"task id {task_id!r} is not a string of 1-255 characters")
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        raise MalformedMessage("args must be a list and kwargs an object")
    retries = fields.get("retries") or 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise MalformedMessage(f"retries {retries!r} is not a non-negative integer")
    return CeleryTask(
        task=task,
        id=task_id,
        args=list(args),
        kwargs=kwargs,
        eta=_when(fields.get("eta"), "eta"),
        expires=_when(fields.get("expires"), "expires"),
        retries=retries,
        root_id=fields.get("root_id"),
        parent_id=fields.get("parent_id"),
        group=fields.get("group"),
    )


def build(
    task: str,
    args: list[Any] | tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    task_id: str,
    eta: dt.datetime | None = None,
    expires: dt.datetime | None = None,
    retries: int = 0,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(JSON body, headers, properties) of a protocol 2 message a Celery worker runs as if
    ``app.send_task`` had sent it."""
    if not isinstance(task, str) or not task:
        raise ValidationError("task name must be a non-empty string")
    try:
        body = kombu_dumps(
            [list(args), dict(kwargs), {"callbacks": None, "errbacks": None,
                                        "chain": None, "chord": None}],
            allow_nan=False,  # NaN/Infinity are not JSON: other consumers would refuse them
        )  # fmt: skip
    except RecursionError:
        raise ValidationError("arguments are nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"arguments are not JSON-serialisable: {exc}") from exc
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": eta.isoformat() if eta else None,
        "expires": expires.isoformat() if expires else None,
        "group": None,
        "group_index": None,
        "retries": retries,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(tuple(args))[:1024],
        "kwargsrepr": repr(kwargs)[:1024],
        "origin": f"django_jobq@{socket.gethostname()}:{os.getpid()}",
        "ignore_result": False,
    }
    properties = {"correlation_id": task_id, "reply_to": ""}
    return body, headers, properties
