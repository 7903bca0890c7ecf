"""Broadcasts on Redis: one stream per broadcast, one consumer group per subscriber group.

Every transition is one Lua script (``lua/bc_*.lua``); the key schema is in
``lua/includes/bcast.lua`` and every key is built by ``BroadcastKeys``. Leases are a ZSET of
deadlines by the storage clock, not the pending list's idle time, so the injected clock of the
tests and the server's TIME decide them alike; the pending list (XCLAIM) records which consumer
holds which entry, and the fencing token is a per-entry counter that starts from the server's
clock, as a job's (a group subscribed again never hands out an old group's token).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from ...errors import UnknownGroup
from ...job import AckOutcome
from ..broadcast_base import (
    BroadcastStore,
    DeadMessage,
    Delivery,
    DeliveryState,
    GroupStatus,
    NewMessage,
    Published,
    PublishOutcome,
    Retention,
    Settle,
    Waiter,
)
from .connection import (
    MAX_BLOCK_SECONDS,
    _Waits,
    blocking_command,
    cluster_blocking,
    is_cluster_client,
    key_slot,
)
from .roundtrip import token_nonce
from .scripts import _read

NAMES = ("bc_publish", "bc_subscribe", "bc_claim", "bc_settle", "bc_lease", "bc_dead")
SOURCES = {name: _read(name) for name in NAMES}
SHAS = {n: hashlib.sha1(s.encode(), usedforsecurity=False).hexdigest() for n, s in SOURCES.items()}
GROUP_SUFFIXES = ("tok", "fail", "stall", "lease", "retry", "dead", "dd", "err", "prog")


@dataclass(frozen=True, slots=True)
class BroadcastKeys:
    """Keys of one broadcast; all share the hash tag ``{prefix:bc:name}`` (a queue name cannot
    contain ``:``, so no queue's tag can be one of these)."""

    tag: str

    @classmethod
    def for_broadcast(cls, prefix: str, name: str) -> BroadcastKeys:
        return cls("{" + f"{prefix}:bc:{name}" + "}")

    def __getattr__(self, suffix: str) -> str:  # log, ids, meta, groups, missed, nudge
        if suffix.startswith("_"):
            raise AttributeError(suffix)
        return f"{self.tag}:{suffix}"

    @property
    def group_prefix(self) -> str:
        return f"{self.tag}:g:"

    def group(self, group: str, suffix: str) -> str:
        return f"{self.group_prefix}{group}:{suffix}"

    @staticmethod
    def registry(prefix: str) -> str:
        """SET of broadcast names (its own slot: written beside the scripts, not in them)."""
        return f"{prefix}:broadcasts"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBroadcasts(BroadcastStore):
    def __init__(
        self, client: Any, *, prefix: str = "jobq", clock: Callable[[], int] | None = None
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._registered: set[str] = set()  # names this process already added to the registry

    def _k(self, name: str) -> BroadcastKeys:
        return BroadcastKeys.for_broadcast(self.prefix, name)

    def _now_arg(self) -> int:
        return self.clock() if self.clock else 0

    def _call(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.client.evalsha(SHAS[script], len(keys), *keys, *args)
        except NoScriptError:  # after a restart, failover or SCRIPT FLUSH
            self.client.script_load(SOURCES[script])
            return self.client.evalsha(SHAS[script], len(keys), *keys, *args)

    def _register(self, name: str) -> None:
        """Add ``name`` to the registry of broadcasts, once per process: a round trip per
        publish would halve the single-message publish rate."""
        if name not in self._registered:
            self.client.sadd(BroadcastKeys.registry(self.prefix), name)
            self._registered.add(name)

    # -- producer ---------------------------------------------------------------------------

    def publish(
        self, name: str, messages: Sequence[NewMessage], retention: Retention
    ) -> list[Published]:
        k = self._k(name)
        args: list[Any] = [self._now_arg(), retention.maxlen or 0, retention.max_age or 0]
        for m in messages:
            args += [m.message_id, m.payload, m.content_type]
        flat = self._call(
            "bc_publish", [k.log, k.ids, k.meta, k.groups, k.missed, k.group_prefix], args
        )
        self.client.sadd(BroadcastKeys.registry(self.prefix), name)
        return [
            Published(m.message_id, PublishOutcome(_s(flat[2 * i])), _s(flat[2 * i + 1]))
            for i, m in enumerate(messages)
        ]

    # -- groups -----------------------------------------------------------------------------

    def subscribe(self, name: str, group: str, start: str | int = "now") -> bool:
        k = self._k(name)
        self._register(name)
        return bool(
            self._call("bc_subscribe", [k.log, k.meta, k.groups, k.missed], [group, str(start)])
        )

    def unsubscribe(self, name: str, group: str) -> bool:
        k = self._k(name)
        if not self.client.hexists(k.groups, group):
            return False
        pipe = self.client.pipeline(transaction=True)
        pipe.xgroup_destroy(k.log, group)
        pipe.hdel(k.groups, group)
        pipe.hdel(k.missed, group)
        pipe.delete(*(k.group(group, s) for s in GROUP_SUFFIXES))
        pipe.execute()
        return True

    # -- consumer ---------------------------------------------------------------------------

    def claim(
        self, name: str, group: str, consumer: str, count: int, lease_ms: int, max_stalls: int
    ) -> list[Delivery]:
        k = self._k(name)
        flat = self._call(
            "bc_claim",
            [k.log, k.groups, k.missed, k.group_prefix],
            [self._now_arg(), group, consumer, count, lease_ms, max_stalls, token_nonce()],
        )
        if flat == -1:
            raise UnknownGroup(name, group)
        out = []
        for i in range(0, len(flat), 6):
            pos = _s(flat[i])
            out.append(
                Delivery(
                    name,
                    group,
                    pos,
                    int(flat[i + 1]),
                    int(flat[i + 2]),
                    _s(flat[i + 3]),
                    flat[i + 4],
                    _s(flat[i + 5]),
                    int(pos.split("-")[0]),
                )
            )
        return out

    def settle(self, name: str, group: str, verdicts: Sequence[Settle]) -> list[AckOutcome]:
        k = self._k(name)
        args: list[Any] = [self._now_arg(), group]
        for v in verdicts:
            args += [v.kind.value, v.position, v.token, v.retry_in, v.error]
        flat = self._call("bc_settle", [k.log, k.group_prefix], args)
        return [AckOutcome(_s(x)) for x in flat]

    def heartbeat(
        self, name: str, group: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[str]:
        if not leases:
            return []
        args: list[Any] = [self._now_arg(), group, "extend", lease_ms]
        for position, token in leases:
            args += [position, token]
        return [_s(x) for x in self._call("bc_lease", [self._k(name).group_prefix], args)]

    def report(self, name: str, group: str, position: str, token: int, progress: bytes) -> bool:
        args = [self._now_arg(), group, "progress", progress, position, token]
        return bool(self._call("bc_lease", [self._k(name).group_prefix], args))

    # -- inspection -------------------------------------------------------------------------

    def delivery(self, name: str, group: str, message_id: str) -> DeliveryState:
        """The group's oldest delivery of ``message_id``, as memory and the database answer: a
        dead letter whose message retention dropped (indexed by ``bc_publish``) first."""
        k = self._k(name)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(k.group(group, "dd"), f"id:{message_id}")
        pipe.hget(k.ids, message_id)
        dropped, retained = pipe.execute()
        pos = dropped if dropped is not None else retained
        if pos is None:
            return DeliveryState("unknown")
        pos = _s(pos)
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(k.group(group, "lease"), pos)
        pipe.zscore(k.group(group, "retry"), pos)
        pipe.zscore(k.group(group, "dead"), pos)
        pipe.hget(k.group(group, "fail"), pos)
        pipe.hget(k.group(group, "prog"), pos)
        pipe.hget(k.group(group, "err"), pos)
        pipe.hget(k.group(group, "dd"), f"{pos}:e")
        pipe.xrange(k.log, pos, pos)
        pipe.hget(k.groups, group)
        lease, retry, dead, fail, prog, err, dead_err, entry, read = pipe.execute()
        attempts = int(fail or 0)
        if lease is not None or retry is not None or dead is not None:
            state = "active" if lease is not None else "retrying" if retry is not None else "dead"
            return DeliveryState(state, attempts, prog, dead_err if dead is not None else err)
        n = int(entry[0][1][b"n"]) if entry else 0
        return DeliveryState("done" if read is not None and n <= int(read) else "unread")

    def status(self, name: str) -> list[GroupStatus]:
        k = self._k(name)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(k.groups)
        pipe.hgetall(k.missed)
        pipe.hget(k.meta, "n")
        pipe.xrange(k.log, "-", "+", count=1)
        reads, missed, last, first = pipe.execute()
        if not reads:
            return []
        last_n = int(last or 0)
        first_n = int(first[0][1][b"n"]) if first else last_n + 1
        groups = sorted(_s(g) for g in reads)
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            for suffix in ("lease", "retry", "dead"):
                pipe.zcard(k.group(g, suffix))
        cards = pipe.execute()
        positions = {
            _s(info["name"]): _s(info["last-delivered-id"])
            for info in self.client.xinfo_groups(k.log)
        }
        out = []
        for i, g in enumerate(groups):
            read = int(reads[g.encode()])
            lag = max(0, last_n - max(read, first_n - 1))
            position = positions.get(g, "")
            out.append(
                GroupStatus(
                    g,
                    lag,
                    cards[3 * i],
                    cards[3 * i + 1],
                    cards[3 * i + 2],
                    int(missed.get(g.encode(), 0)),
                    "" if position == "0-0" else position,
                )
            )
        return out

    def length(self, name: str) -> int:
        return int(self.client.xlen(self._k(name).log))

    def names(self) -> list[str]:
        return sorted(_s(n) for n in self.client.smembers(BroadcastKeys.registry(self.prefix)))

    def dead_letters(self, name: str, group: str, limit: int = 100) -> list[DeadMessage]:
        k = self._k(name)
        dead = self.client.zrange(k.group(group, "dead"), 0, limit - 1, withscores=True)
        if not dead:
            return []
        fields = []
        for pos, _ in dead:
            p = _s(pos)
            fields += [f"{p}:m", f"{p}:p", f"{p}:ct", f"{p}:a", f"{p}:e"]
        values = self.client.hmget(k.group(group, "dd"), fields)
        out = []
        for i, (pos, failed_at) in enumerate(dead):
            m, p, ct, a, e = values[5 * i : 5 * i + 5]
            position = _s(pos)
            out.append(
                DeadMessage(
                    position,
                    _s(m or b""),
                    p or b"",
                    _s(ct or b""),
                    int(position.split("-")[0]),
                    int(failed_at),
                    int(a or 0),
                    e or b"",
                )
            )
        return out

    def retry_dead(self, name: str, group: str, positions: Sequence[str] | None = None) -> int:
        k = self._k(name)
        args = [self._now_arg(), group, "retry", *(positions or [])]
        if positions is not None and not positions:
            return 0
        moved = int(self._call("bc_dead", [k.log, k.group_prefix], args))
        if moved:  # due now: wake the idle workers (they watch this stream beside the log)
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(k.nudge, {"retry": group}, maxlen=1, approximate=False)
            pipe.pexpire(k.nudge, 60_000)
            pipe.execute()
        return moved

    def purge_dead(self, name: str, group: str) -> int:
        k = self._k(name)
        return int(
            self._call("bc_dead", [k.log, k.group_prefix], [self._now_arg(), group, "purge"])
        )

    def waiter(self, names: Sequence[str]) -> Waiter:
        return _RedisWaiter(self, [key for n in names for key in (self._k(n).log,
                                                                   self._k(n).nudge)])  # fmt: skip


class _RedisWaiter(Waiter):
    """One ``XREAD BLOCK`` over every served stream, each broadcast's nudge stream (dead
    letters sent back) and a wake stream of its own, from the newest entries seen at
    ``arm()``: a publish to any served broadcast, a retry of its dead letters, or
    ``interrupt()`` (an entry in the wake stream) ends it. On a Redis Cluster the streams of
    several broadcasts are in different slots: one ``XREAD`` per slot, all blocked at once and
    ended together (``cluster._Waits``), so a cluster is waited on without polling as well."""

    def __init__(self, store: RedisBroadcasts, logs: list[str]) -> None:
        super().__init__()
        self.client = store.client
        self.wake = f"{store.prefix}:bcwake:{uuid.uuid4().hex}"
        self.keys = [*logs, self.wake]
        self.ids: list[str] = ["$"] * len(self.keys)
        self._slots: list[list[int]] | None = None  # key indexes by hash slot (cluster only)
        self._waits: Any = None
        if is_cluster_client(self.client):
            by_slot: dict[int, list[int]] = {}
            for index, key in enumerate(self.keys):
                by_slot.setdefault(key_slot(key), []).append(index)
            self._slots = list(by_slot.values())
            if len(self._slots) > 1:
                pool = ThreadPoolExecutor(len(self._slots), thread_name_prefix="jobq-bc-wait")
                self._waits = _Waits(pool)

    def arm(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in self.keys:
            pipe.xrevrange(key, "+", "-", count=1)
        self.ids = [_s(last[0][0]) if last else "0-0" for last in pipe.execute()]

    def wait(self, timeout: float) -> None:
        """Blocks of at most ``MAX_BLOCK_SECONDS`` (a partitioned server is noticed as for any
        blocking call), from the same ids each time, until an entry or ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                wait = min(max(remaining, 0.001), MAX_BLOCK_SECONDS)
                if self._read(wait):
                    return
        finally:
            self.ids = ["$"] * len(self.keys)  # until the next arm(): only what comes from now

    def _read(self, wait: float) -> bool:
        """One blocking read of every key from its id: True when any key had an entry."""
        block = int(wait * 1000)
        if self._slots is None:
            args = ["XREAD", "BLOCK", block, "STREAMS", *self.keys, *self.ids]
            return bool(blocking_command(self.client, wait, *args))
        commands: list[tuple[str, tuple[Any, ...]]] = []
        for indexes in self._slots:
            keys = [self.keys[i] for i in indexes]
            commands.append((keys[0], ("XREAD", "BLOCK", block, "STREAMS", *keys,
                                       *[self.ids[i] for i in indexes])))  # fmt: skip
        if self._waits is None:
            key, command = commands[0]
            return bool(cluster_blocking(self.client, key, wait, *command))
        return any(self._waits.run(self.client, wait, commands))

    def interrupt(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.wake, {"stop": 1}, maxlen=1)
        pipe.pexpire(self.wake, 10_000)  # a worker that is gone must not leave it behind
        pipe.execute()

    def close(self) -> None:
        self.client.delete(self.wake)
        if self._waits is not None:
            self._waits.pool.shutdown(wait=False)
