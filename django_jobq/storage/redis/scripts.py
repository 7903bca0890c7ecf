"""Loads the Lua scripts once at import and runs them by SHA (EVALSHA, reloading on NOSCRIPT).

A script may pull shared helpers with a line ``--@include name``; the loader inlines
``includes/name.lua`` there, so every script Redis sees is self-contained.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

LUA_DIR = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.MULTILINE)


def _read(name: str) -> str:
    source = (LUA_DIR / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: (LUA_DIR / "includes" / f"{m[1]}.lua").read_text(), source)


NAMES = (
    "enqueue", "claim", "heartbeat", "complete", "complete_many", "fail", "release", "postpone",
    "cancel", "change", "reap", "drain", "clean", "control", "retry", "report", "onfail_claim",
    "onfail_settle",
)  # fmt: skip
SOURCES: dict[str, str] = {name: _read(name) for name in NAMES}
SHAS: dict[str, str] = {
    name: hashlib.sha1(src.encode(), usedforsecurity=False).hexdigest()
    for name, src in SOURCES.items()
}


class Scripts:
    """Runs scripts on one client; one round trip per call when the script is cached."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def load_all(self) -> None:
        for source in SOURCES.values():
            self.client.script_load(source)

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.client.evalsha(SHAS[name], len(keys), *keys, *args)
        except NoScriptError:
            self.load_all()  # after a restart, failover or SCRIPT FLUSH
            return self.client.evalsha(SHAS[name], len(keys), *keys, *args)

    def call_many(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Several script calls in one pipelined round trip."""
        return self._run(calls, self._pipeline)

    def call_streamed(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Like ``call_many``, but each call is written to the socket as soon as it is packed,
        so Redis runs call k while the client packs call k+1 (a pipeline packs everything
        first, then waits: client and server time add up instead of overlapping)."""
        return self._run(calls, self._streamed)

    def _run(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]], send) -> list[Any]:
        """Send ``calls`` and raise the first error. A call refused with NOSCRIPT did not run,
        so it is safe to send it again once the scripts are loaded."""
        if not calls:
            return []
        results = send(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            self.load_all()  # after a restart, failover or SCRIPT FLUSH
            again = send([calls[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def _streamed(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            for name, keys, args in calls:
                conn.send_command("EVALSHA", SHAS[name], len(keys), *keys, *args)
            results: list[Any] = []
            for _ in calls:
                try:
                    results.append(conn.read_response())
                except ResponseError as exc:  # that call alone failed (NOSCRIPT, script error)
                    results.append(exc)
            return results
        except BaseException:
            conn.disconnect()  # replies may be left unread: never reuse this connection
            raise
        finally:
            pool.release(conn)

    def _pipeline(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(SHAS[name], len(keys), *keys, *args)
        return pipe.execute(raise_on_error=False)
