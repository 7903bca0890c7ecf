"""The job envelope: per-job settings that travel with the payload instead of in storage.

Per-job timeouts and job flows need a little data beside the payload (a timeout, a flow's
children and, once they finished, their results). Storing it in the payload bytes, wrapped as
``{"payload": ..., "meta": {...}}`` and marked by the content type (``json+env``,
``msgpack+env``), costs no new storage field on any backend and no claim-reply change on the
hot path: a job without such settings is stored exactly as before, and only enveloped jobs pay
for the extra decode. The marker lives in the content type, not in the value, so no user
payload can be mistaken for an envelope.
"""

from __future__ import annotations

from typing import Any

from .serde import Serde

SUFFIX = "+env"
PAYLOAD, META = "payload", "meta"


def is_enveloped(content_type: str) -> bool:
    return content_type.endswith(SUFFIX)


def base_type(content_type: str) -> str:
    """The serde name of a content type: results of an enveloped job use the plain serde."""
    return content_type[: -len(SUFFIX)] if content_type.endswith(SUFFIX) else content_type


def wrap(serde: Serde, payload: Any, meta: dict[str, Any]) -> tuple[bytes, str]:
    """Payload bytes and content type of a job with per-job settings ``meta``."""
    return serde.dumps({PAYLOAD: payload, META: meta}), serde.name + SUFFIX


def unwrap(content_type: str, value: Any) -> tuple[Any, dict[str, Any]]:
    """(payload, meta) of a decoded payload; a plain job has empty meta. An envelope that lost
    its shape (written into storage by hand) is passed on whole, with no settings."""
    if not is_enveloped(content_type):
        return value, {}
    if isinstance(value, dict) and isinstance(value.get(META), dict):
        return value.get(PAYLOAD), value[META]
    return value, {}


def task_name(content_type: str, payload: bytes | None) -> str | None:
    """The task a stored job calls (``meta["task"]``, set by ``tasks/core.py``), or None for a
    plain job. Only an enveloped job pays for a decode; bytes that no longer decode are None
    (the job stays visible by its queue's handler)."""
    if not content_type.endswith(SUFFIX) or not payload:
        return None
    from .queue import serde_for

    try:
        value = serde_for(content_type).loads(payload)
    except Exception:  # noqa: BLE001 - a display helper: never raises over bad bytes
        return None
    name = unwrap(content_type, value)[1].get("task")
    return name if isinstance(name, str) else None
