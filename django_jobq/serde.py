"""Payload and result encodings. No pickle: a queue's bytes must never be able to run code."""

from __future__ import annotations

import json
from typing import Any, Protocol

from .errors import ConfigurationError, SerializationError


class Serde(Protocol):
    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JSONSerde:
    """Compact UTF-8 JSON; the default because every language and every operator can read it."""

    name = "json"

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def dumps(self, value: Any) -> bytes:
        try:
            return self._encoder.encode(value).encode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"value is not JSON-serialisable: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"malformed JSON: {exc}") from exc


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
            return self._msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"value is not msgpack-serialisable: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise SerializationError(f"malformed msgpack: {exc}") from exc


_SERDES: dict[str, type] = {"json": JSONSerde, "msgpack": MsgpackSerde}


def get_serde(name_or_obj: str | Serde) -> Serde:
    if not isinstance(name_or_obj, str):
        return name_or_obj
    try:
        return _SERDES[name_or_obj]()
    except KeyError:
        raise ConfigurationError(
            f"unknown serde {name_or_obj!r}; choose one of {sorted(_SERDES)}"
        ) from None
