"""``ClusterRedisStorage``: the Redis backend on a Redis Cluster (the client and the
per-slot blocking steps are ``connection.py``'s).

Every key of a queue carries the hash tag ``{prefix:queue}`` (``keys.py``), so each script call
runs in one slot; what this variant changes are the steps that name keys of *several* queues at
once, which a cluster refuses as CROSSSLOT: waits over queues of several slots, the mirror's
reads over many queues' streams, and the server identity the mirror uses to notice a restart.
``RedisStorage(client)`` of a ``RedisCluster`` client builds this class (it is registered with
``serves_cluster=True``; this package's ``__init__`` imports it).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import StorageUnavailable
from ...job import Event
from ..base import Clock
from . import storage as _storage
from .connection import _Waits, cluster_blocking, key_slot, node_client, refresh_topology
from .scripts import SHAS, Scripts
from .storage import RedisStorage, _event, _s


class ClusterScripts(Scripts):
    """Scripts on a cluster: SCRIPT LOAD goes to every master (redis-py routes it so), and a
    streamed batch is a cluster pipeline, which splits the calls by node."""

    def call_streamed(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Calls of one slot (a queue's bulk enqueue) are streamed on the owning master's
        connection, as on a single Redis; calls of several slots, or a batch that met a
        redirection (MOVED/ASK/TRYAGAIN: those calls did not run), go through the pipeline."""
        from redis.exceptions import AskError, MovedError

        slots = {key_slot(keys[0]) for _, keys, _ in calls if keys}
        if len(slots) != 1:
            return self.call_many(calls)
        node = Scripts(node_client(self.client, calls[0][1][0]))
        results = node._streamed(calls)
        moved = [i for i, r in enumerate(results) if isinstance(r, MovedError | AskError)]
        if moved:
            refresh_topology(self.client)
            again = self._run([calls[i] for i in moved], self._pipeline)
            for i, result in zip(moved, again, strict=True):
                results[i] = result
        return self._settle(calls, results, self._pipeline)  # NOSCRIPT: a failover's master

    def _pipeline(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """redis-py's cluster pipeline refuses ``evalsha`` by name but routes the raw command
        by its first key (EVALSHA's keys follow the key count), following MOVED/ASK."""
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.execute_command("EVALSHA", SHAS[name], len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))


class ClusterRedisStorage(RedisStorage, serves_cluster=True):
    """``RedisStorage`` on a Redis Cluster: the same scripts and keys; the steps that span
    several queues' slots are split per slot (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "jobq",
        events_maxlen: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(client, prefix=prefix, events_maxlen=events_maxlen, clock=clock)
        self.scripts = ClusterScripts(client)
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="jobq-cluster-wait")
        self._waits = _Waits(self._pool)

    def unavailable(self, exc: Exception) -> StorageUnavailable | None:
        """Besides an unreachable node: a slot without a master (a failover in progress,
        CLUSTERDOWN) and a slot being migrated whose keys a script needs on both sides
        (TRYAGAIN past the client's retries). Both end within seconds; neither ran the call."""
        from redis.exceptions import ClusterDownError, ClusterError, TryAgainError

        if isinstance(exc, ClusterDownError | ClusterError | TryAgainError):
            return StorageUnavailable(f"Redis Cluster: {type(exc).__name__}: {exc}")
        return super().unavailable(exc)

    def _by_slot(self, keys: Sequence[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(key_slot(key), []).append(key)
        return groups

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        timeout = min(max(timeout, 0.001), _storage.MAX_BLOCK_SECONDS)
        keys = [self.keys(q).wake for q in queues]
        if worker_id is not None:
            # interrupt_wait pushes here: the slot of the first queue, waited on like the rest
            keys.append(self.keys(queues[0]).worker_wake(worker_id))
        groups = list(self._by_slot(keys).values())
        if len(groups) == 1:
            cluster_blocking(self.client, keys[0], timeout, "BLPOP", *keys, timeout)
            return
        commands = [(g[0], ("BLPOP", *g, timeout)) for g in groups]
        self._waits.run(self.client, timeout, commands)

    def read_group(
        self,
        queues: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int = 1000,
        block: float | None = None,
        pending: bool = False,
        lost: list[str] | None = None,
    ) -> list[Event]:
        by_slot: dict[int, list[str]] = {}
        for q in queues:
            by_slot.setdefault(key_slot(self.keys(q).events), []).append(q)
        if len(by_slot) <= 1:
            return super().read_group(
                queues, group, consumer, count=count, block=block, pending=pending, lost=lost
            )
        events: list[Event] = []
        for part in by_slot.values():  # what is there now, without waiting
            events += super().read_group(
                part, group, consumer, count=count, pending=pending, lost=lost
            )
        if events or not block or pending:
            return events
        wait = min(block, _storage.MAX_BLOCK_SECONDS)
        commands = []
        for part in by_slot.values():
            streams = [self.keys(q).events for q in part]
            commands.append((streams[0], (
                "XREADGROUP", "GROUP", group, consumer, "COUNT", count, "BLOCK",
                int(wait * 1000), "STREAMS", *streams, *([">"] * len(streams)),
            )))  # fmt: skip
        by_key = {self.keys(q).events: q for q in queues}
        for reply in self._waits.run(self.client, wait, commands):
            for stream, entries in reply or []:
                queue = by_key[_s(stream)]
                for event_id, fields in entries:
                    if fields:
                        events.append(_event(queue, event_id, fields))
        return events

    def _kept_events(self, after: dict[str, str], count: int) -> dict[str, list[Event]]:
        """One checked read per slot (a sharded queue's partitions are in slots of their
        own): the ``events`` script takes only keys of one slot."""
        by_key = {self.keys(q).events: q for q in after}
        out: dict[str, list[Event]] = {}
        for keys in self._by_slot(list(by_key)).values():
            queues = [by_key[k] for k in keys]
            reply = self.scripts.call("events", keys, [count, *(after[q] for q in queues)])
            out.update(self._checked(after, queues, reply))
        return out

    def _wait_events(self, after: dict[str, str], wait: float) -> None:
        """One ``XREAD`` per slot, waiting at once and ended together (``_Waits``)."""
        by_key = {self.keys(q).events: q for q in after}
        groups = list(self._by_slot(list(by_key)).values())
        if len(groups) == 1:
            super()._wait_events(after, wait)
            return
        commands = [(g[0], ("XREAD", "COUNT", 1, "BLOCK", int(wait * 1000), "STREAMS", *g,
                            *(after[by_key[k]] for k in g))) for g in groups]  # fmt: skip
        self._waits.run(self.client, wait, commands)

    def server_id(self) -> str:
        """Every master's ``run_id`` (sorted, hashed): a restart of any of them may have lost
        keys, and a failover puts a replica in its place whose data may lag."""
        ids = sorted(_s(i["run_id"]) for i in self._per_master("server"))
        return f"cluster-{zlib.crc32(','.join(ids).encode()):08x}-{len(ids)}"

    def memory_info(self) -> dict[str, Any]:
        """The fullest master's memory figures: the first to fill stops its queues."""
        infos = self._per_master("memory")
        fullest = max(infos, key=lambda i: i.get("used_memory") or 0)
        return {k: fullest.get(k) for k in ("used_memory", "used_memory_peak", "maxmemory",
                                            "maxmemory_policy")}  # fmt: skip

    def _per_master(self, section: str) -> list[dict[str, Any]]:
        from redis.cluster import RedisCluster

        reply = self.client.info(section, target_nodes=RedisCluster.PRIMARIES)
        if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
            return list(reply.values())
        return [reply]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().close()
