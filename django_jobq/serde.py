"""Payload and result encodings. No pickle: a queue's bytes must never be able to run code.

Every value a job carries passes ``dumps`` here, so this is the one place that refuses what
the rest of the system could not hold: NaN and infinities (JSON has no spelling for them,
SQLite's ``JSON_VALID`` and PostgreSQL's ``jsonb`` reject them, and a REST reader would get a
500) and nesting deeper than the interpreter can walk (a raw ``RecursionError`` otherwise).
A dict key that is not a string is refused too: JSON turns ``1`` into ``"1"``, so
``{1: "x", "1": "y"}`` would come back as ``{"1": "y"}``, a key lost with no error (msgpack
would keep it, but the API, the admin and the mirror read every value as JSON). All three
raise ``InvalidPayload`` before anything is stored.

The job envelope lives here too: per-job settings that travel with the payload instead of in
storage. Per-job timeouts, job flows and task functions need a little data beside the payload
(a timeout, a flow's children and, once they finished, their results, the task's name). Storing
it in the payload bytes, wrapped as ``{"payload": ..., "meta": {...}}`` and marked by the
content type (``json+env``, ``msgpack+env``), costs no new storage field on any backend and no
claim-reply change on the hot path: a job without such settings is stored exactly as before,
and only enveloped jobs pay for the extra decode. The marker lives in the content type, not in
the value, so no user payload can be mistaken for an envelope.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Protocol

from .errors import ConfigurationError, InvalidPayload

_TOO_DEEP = "nested too deeply"


class Serde(Protocol):
    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


_UTF8_BOM = b"\xef\xbb\xbf"


class JSONSerde:
    """Compact UTF-8 JSON; the default because every language and every operator can read it."""

    name = "json"

    def __init__(self) -> None:
        # allow_nan=False: the C encoder refuses NaN/Infinity while it encodes, at no cost.
        self._encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def dumps(self, value: Any) -> bytes:
        try:
            body = self._encoder.encode(value).encode()
        except RecursionError:
            raise InvalidPayload(f"value is {_TOO_DEEP} to encode as JSON") from None
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"value is not JSON-serialisable: {exc}") from exc
        if type(value) is not str:  # encoded, so the depth is walkable
            _check_keys(value)
        return body

    def loads(self, data: bytes) -> Any:
        try:
            if type(data) is bytes and data[:3] != _UTF8_BOM and 0 not in data[:4]:
                # UTF-8 as jobq writes it: decoded here, so ``json.loads`` skips its encoding
                # detection (a third of its time on a small payload). A BOM or NUL bytes
                # (UTF-16/32) go on to ``json.loads``, which detects them as before.
                try:
                    return json.loads(data.decode())
                except UnicodeDecodeError:
                    pass
            return json.loads(data)
        except RecursionError:
            raise InvalidPayload(f"JSON {_TOO_DEEP} to decode") from None
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"malformed JSON: {exc}") from exc


class MsgpackSerde:
    """Smaller and faster than JSON for binary-heavy payloads; needs the ``msgpack`` extra."""

    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                "the msgpack serde needs the extra: pip install 'django-jobq[msgpack]'"
            ) from exc
        self._msgpack = msgpack

    def dumps(self, value: Any) -> bytes:
        try:
            body: bytes = self._msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError) as exc:  # msgpack's own depth limit is a ValueError
            raise InvalidPayload(f"value is not msgpack-serialisable: {exc}") from exc
        # msgpack encodes any double; the same rule as JSON keeps a job readable as JSON
        # (API, admin, mirror). A non-finite double is packed as 0xcb then an exponent of all
        # ones (0x7f/0xff, 0xf_): bytes without 0xcb 0x7f / 0xcb 0xff hold none, and cost
        # two scans in C; otherwise (maybe just binary data) the value is walked. packb
        # succeeded, so the depth is within msgpack's limit.
        if (b"\xcb\x7f" in body or b"\xcb\xff" in body) and not _finite(value):
            raise InvalidPayload("value holds a NaN or infinite float (not storable as JSON)")
        _check_keys(value)
        return body

    def loads(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise InvalidPayload(f"malformed msgpack: {exc}") from exc


def _check_keys(value: Any) -> None:
    """Refuse a dict key that is not a string, anywhere inside ``value`` (module docstring)."""
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidPayload(
                    f"dict keys must be strings, got {type(key).__name__} key {key!r}: JSON "
                    "would turn it into a string (and drop a key it then collides with)"
                )
            if type(item) in _CONTAINERS:
                _check_keys(item)
    elif type(value) in _CONTAINERS:
        for item in value:
            if type(item) in _CONTAINERS:
                _check_keys(item)
    elif isinstance(value, dict | list | tuple):  # subclasses: the slow, general walk
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                raise InvalidPayload(f"dict keys must be strings, got {type(key).__name__} "
                                     f"key {key!r}")  # fmt: skip
            _check_keys(item)


_CONTAINERS = frozenset({dict, list, tuple})


def _finite(value: Any) -> bool:
    """True when no float inside ``value`` is NaN or infinite (containers walked)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(k) and _finite(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def check_json_value(value: Any, what: str) -> bytes:
    """``value`` as compact JSON, refusing what a database JSON column cannot hold: NaN and
    infinities, nesting too deep, and the NUL character (PostgreSQL's ``jsonb`` rejects
    ``\\u0000``). For values stored as JSON beside a job (progress)."""
    body = JSON.dumps(value)
    if b"\\u0000" in body and _has_nul(value):  # the bytes alone may be an escaped backslash
        raise InvalidPayload(f"{what} holds a NUL character (\\u0000), which databases refuse")
    return body


_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(line: str) -> str:
    """Text every storage and database can hold: NUL (refused by PostgreSQL's text and jsonb)
    and lone surrogates (not UTF-8) become U+FFFD. For text that must be kept whatever it
    holds (log lines, error messages and tracebacks), where refusing would lose the record."""
    if "\x00" in line:
        line = line.replace("\x00", "\ufffd")
    if not line.isascii():
        line = _SURROGATE.sub("\ufffd", line)
    return line


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


_SERDES: dict[str, type] = {"json": JSONSerde, "msgpack": MsgpackSerde}
JSON = JSONSerde()


def get_serde(name_or_obj: str | Serde) -> Serde:
    if not isinstance(name_or_obj, str):
        return name_or_obj
    try:
        return _SERDES[name_or_obj]()
    except KeyError:
        raise ConfigurationError(
            f"unknown serde {name_or_obj!r}; choose one of {sorted(_SERDES)}"
        ) from None


_SERDE_CACHE: dict[str, Serde] = {}


def serde_for(content_type: str) -> Serde:
    """Decode by the content type stored with each job, so a change of SERDE setting never
    makes older jobs unreadable."""
    serde = _SERDE_CACHE.get(content_type)
    if serde is None:
        serde = _SERDE_CACHE[content_type] = get_serde(base_type(content_type))
    return serde


# -- the job envelope (see the module docstring) ---------------------------------------------

SUFFIX = "+env"
PAYLOAD, META = "payload", "meta"
TASK_META = "task"  # the meta key naming a task function's job type (``tasks/core.py``)


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
    try:
        value = serde_for(content_type).loads(payload)
    except Exception:  # noqa: BLE001 - a display helper: never raises over bad bytes
        return None
    name = unwrap(content_type, value)[1].get(TASK_META)
    return name if isinstance(name, str) else None
