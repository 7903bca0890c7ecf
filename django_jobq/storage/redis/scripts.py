"""Loads the Lua scripts once at import and runs them by SHA (EVALSHA, reloading on NOSCRIPT).

A call costs one round trip while the script is cached: nothing asks Redis whether it is
(no SCRIPT EXISTS); a NOSCRIPT reply (after a restart, failover or SCRIPT FLUSH) means the
call did not run, so the scripts are loaded and it is sent again.

A script may pull shared helpers with a line ``--@include name``; the loader inlines
``includes/name.lua`` there, so every script Redis sees is self-contained. ``--@include spec``
is generated: the constants and error texts the three backends share (``states.LUA_SPEC``),
as Lua locals, so no script spells out its own copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from ...states import LUA_SPEC
from .connection import pooled_connection

LUA_DIR = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.MULTILINE)


def spec_include() -> str:
    """``states.LUA_SPEC`` as Lua: a number as it is, a text as a long string (no escapes)."""
    return "".join(
        f"local {name} = {value}\n" if isinstance(value, int) else f"local {name} = [=[{value}]=]\n"
        for name, value in LUA_SPEC.items()
    )


def _include(name: str) -> str:
    return spec_include() if name == "spec" else (LUA_DIR / "includes" / f"{name}.lua").read_text()


def _read(name: str) -> str:
    return _INCLUDE.sub(lambda m: _include(m[1]), (LUA_DIR / f"{name}.lua").read_text())


NAMES = (
    "enqueue", "enqueue_one", "claim", "heartbeat", "complete", "complete_many", "fail",
    "release", "postpone", "cancel", "change", "reap", "drain", "clean", "control", "retry",
    "report", "onfail_claim", "onfail_settle", "records", "retain", "unwait", "events",
)  # fmt: skip
SOURCES: dict[str, str] = {name: _read(name) for name in NAMES}
SHAS: dict[str, str] = {
    name: hashlib.sha1(src.encode(), usedforsecurity=False).hexdigest()
    for name, src in SOURCES.items()
}

# A pool this large or larger lends the hot single-job paths connections it keeps between
# calls (see ``Scripts.take``); a smaller one is left alone, where connections held back could
# make another caller wait for one (``BlockingConnectionPool``) or fail ("Too many
# connections").
KEEP_CONNECTION_MIN_POOL = 64
# At most this many per pool. One per hot path that can be in flight at once in a process
# (a worker: the idle wait on one handler thread while another sends its verdict; a web
# process: a few request/responses at a time); more go back to the pool as before.
KEEP_CONNECTIONS = 4


class _Kept:
    """The connections a pool lends the hot paths between calls (see ``Scripts.take``)."""

    __slots__ = ("conns", "pid")

    def __init__(self) -> None:
        # Weak: the pool holds its in-use connections, and a connection holds its pool
        # (redis-py's maintenance handler); a strong reference here would keep both forever.
        self.conns: list[weakref.ref[Any]] = []  # at most KEEP_CONNECTIONS
        self.pid = os.getpid()


# One per pool, shared by every Scripts of its clients: the number of connections kept aside
# does not grow with the number of storages made on one client (tests make thousands). Weak
# both ways, so the pool, its connections and this entry go together.
_KEPT: weakref.WeakKeyDictionary[Any, _Kept] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _kept_for(pool: Any) -> _Kept | None:
    if getattr(pool, "max_connections", 0) < KEEP_CONNECTION_MIN_POOL:
        return None
    with _KEPT_LOCK:
        kept = _KEPT.get(pool)
        if kept is None:
            kept = _KEPT[pool] = _Kept()
        return kept


class Scripts:
    """Runs scripts on one client; one round trip per call when the script is cached."""

    def __init__(self, client: Any) -> None:
        self.client = client
        # None for a client without one pool (a cluster client): call_packed then takes the
        # client's own path.
        self._pool = getattr(client, "connection_pool", None)
        self._kept = None if self._pool is None else _kept_for(self._pool)

    def load_all(self) -> None:
        for source in SOURCES.values():
            self.client.script_load(source)

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # NOSCRIPT after a restart, failover or SCRIPT FLUSH: load the scripts and call again.
        # Twice more at most: another SCRIPT FLUSH (or a second failover) can land between
        # the load and the call, which a single reload turned into an error.
        for attempt in range(3):
            try:
                return self.client.evalsha(SHAS[name], len(keys), *keys, *args)
            except NoScriptError:
                if attempt == 2:
                    raise
                self.load_all()
        raise AssertionError("unreachable")  # pragma: no cover

    def call_packed(
        self,
        name: str,
        packed: bytes,
        arguments: Callable[[], tuple[Sequence[str], Sequence[Any]]],
    ) -> Any:
        """``call(name, *arguments())`` where ``packed`` is that EVALSHA already in the wire
        format (RESP), written and read on a pooled connection directly (``arguments`` is
        only called to send it again the ordinary way).

        Why: on the hot single-job paths (one enqueue per call) redis-py's command layer
        (argument packing, retry and event wrappers) costs more client time than the round
        trip itself. The guarantees are the client's: a NOSCRIPT reply or a refused or reset
        connection sends the call again through ``call`` (which loads the scripts, and retries
        a connection error with the client's backoff: the scripts sent this way deduplicate
        or fence a repeat), a timeout is raised without a retry, and a connection whose reply
        may be left unread is closed, never reused."""
        pool = self._pool
        if pool is None:
            return self.call(name, *arguments())
        try:
            conn = self.take(pool)
        except ConnectionError:  # refused: the client's path retries it with its backoff
            return self.call(name, *arguments())
        try:
            conn.send_packed_command((packed,))
            return conn.read_response()
        except NoScriptError:
            pass  # the reply was read in full: the connection stays usable
        except ConnectionError:
            conn.disconnect()
        except ResponseError:
            raise  # an error reply, read in full (a script error, OOM)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self.give(pool, conn)
        return self.call(name, *arguments())

    def take(self, pool: Any) -> Any:
        """A connection for a hot path (``call_packed``, ``roundtrip``'s request/response and
        idle wait): one kept from an earlier call, else the pool's. Give it back with ``give``
        only after its last reply was read in full (or after ``disconnect``).

        Why keep one: taking a connection from redis-py 8's pool and giving it back (its lock,
        four observability counters, a release event and a ``poll`` of the socket for unread
        data) costs more client time than the rest of a lone enqueue's Python. The kept
        connection stays counted as in use by the pool, so ``pool.disconnect()`` (the client's
        ``close``) still closes it, and a later call connects it again. It only comes back
        here after its reply was read in full, so it never holds a stale reply; a connection
        the server closed meanwhile fails the call with ``ConnectionError``, which sends it
        again the ordinary way, as for a pooled connection that went bad. After a fork the
        parent's connection is dropped unused (the pool resets itself the same way)."""
        kept = self._kept
        if kept is not None and kept.conns:
            try:
                conn = kept.conns.pop()()
            except IndexError:  # another thread took it between the test and the pop
                pass
            else:
                if kept.pid == os.getpid() and conn is not None:
                    return conn
                kept.conns.clear()  # forked: the parent's, unused here (never closed here)
                kept.pid = os.getpid()
        return pooled_connection(pool, "EVALSHA")

    def give(self, pool: Any, conn: Any) -> None:
        """Back after a call: kept for the next hot call, or to the pool. A connection closed
        after an error goes to the pool: kept, it would be connected again by the next hot
        call while the pool connected its own for the other callers, so every outage would
        leave a process holding more connections than before it (the pool reuses it)."""
        kept = self._kept
        if (
            kept is not None
            and getattr(conn, "_sock", None) is not None  # redis-py's own: None when closed
            and len(kept.conns) < KEEP_CONNECTIONS
            and kept.pid == os.getpid()
        ):
            kept.conns.append(weakref.ref(conn))
        else:
            pool.release(conn)

    def call_many(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Several script calls in one pipelined round trip. A single call goes without the
        pipeline (the verdict of a quiet worker's only job, on the request/response path:
        a pipeline object costs more client time than the call)."""
        if len(calls) == 1:
            return [self.call(*calls[0])]
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
        return self._settle(calls, send(calls), send)

    def _settle(self, calls: Sequence[Any], results: list[Any], send) -> list[Any]:
        """``results`` of ``calls``: those refused with NOSCRIPT sent again by ``send`` once
        the scripts are loaded; then the first error raised."""
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
        conn = pooled_connection(pool, "EVALSHA")  # redis-py 5 needs the command name
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


# Packed call heads a storage keeps (per queue and option set): bounded, cleared when full.
PACKED_HEADS = 256


def resp(value: Any) -> bytes:
    """One argument in the wire format (RESP bulk string), encoded as redis-py encodes it."""
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, int) and not isinstance(value, bool):
        value = b"%d" % value
    elif not isinstance(value, bytes):
        raise TypeError(f"cannot pack {type(value).__name__}")
    return b"$%d\r\n%s\r\n" % (len(value), value)


# Single enqueues whose head (everything up to the job's own three arguments) is kept packed.
PACKED_HEADS = 256


def script_head(name: str, keys: Sequence[Any], args: Sequence[Any], tail: int) -> bytes:
    """An ``EVALSHA`` of script ``name`` with ``keys`` and ``args`` in the wire format, its
    header counting ``tail`` more arguments that the caller appends per call. Why: the hot
    single-job calls (enqueue, completion, an idle worker's claim) share everything but their
    last arguments, and redis-py packs ~25 arguments in more client time than the round trip
    takes; the head is packed once from the call's one definition and kept. Raises
    ``TypeError`` for an argument the wire format here does not cover."""
    parts = [resp(x) for x in ("EVALSHA", SHAS[name], len(keys), *keys, *args)]
    return b"*%d\r\n%s" % (3 + len(keys) + len(args) + tail, b"".join(parts))


def keep_head(cache: dict[Any, bytes], key: Any, head: bytes) -> bytes:
    """``head`` kept in ``cache`` under ``key``; a full cache (many distinct run_at values,
    waits cut short by scheduled jobs) is emptied first, so it stays bounded."""
    if len(cache) >= PACKED_HEADS:
        cache.clear()
    cache[key] = head
    return head
