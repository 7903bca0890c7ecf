"""Native async I/O of the Redis backend: the body of ``RedisStorage``'s async twins
(``aenqueue``, ``aget_record``, ``await_for_outcome``, ``aregister_queue``), which
``Queue.aenqueue`` & co. call from ASGI views and async task code.

The same scripts and keys as the sync storage (its ``_enqueue_call`` and ``_parse_enqueue``
build and read the call, so both paths stay one protocol), sent through a ``redis.asyncio``
client made from the sync client's connection settings. Waiting for an outcome is an async
``BLPOP`` on the job's done key: an event loop waits on thousands of jobs with no thread per
waiter. One client per (storage, event loop), since an asyncio connection belongs to the loop
that opened it. A cluster or a foreign client takes the base class's thread hops
(``storage/base.py``), as the database and memory backends do.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from ...job import FinalOutcome, JobRecord, NewJob, StoredEnqueue, final_outcome
from ..base import Storage
from .connection import MAX_BLOCK_SECONDS
from .roundtrip import outcome
from .scripts import SHAS, SOURCES

# The async clients, per event loop, then per storage; weak on both sides, so a closed loop's
# clients go with it and so does the client of a storage that was let go (a JOBQ setting change
# replaces the process's storage). Keyed by id(storage) as before, a later storage could get a
# collected one's id and be handed its client: another server or database than its own.
_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Storage, Any]
] = weakref.WeakKeyDictionary()


def native(storage: Any) -> bool:
    """Whether ``storage`` (a ``RedisStorage``) gets native async I/O here: on a plain
    ``redis.Redis`` client (a cluster or a foreign client takes the thread path)."""
    import redis

    return type(storage.client) is redis.Redis


def _async_client(storage: Any) -> Any:
    loop = asyncio.get_running_loop()
    per_loop = _CLIENTS.get(loop)
    if per_loop is None:
        per_loop = _CLIENTS[loop] = weakref.WeakKeyDictionary()
    client = per_loop.get(storage)
    if client is None:
        client = per_loop[storage] = _client_like(storage.client)
    return client


def _client_like(sync_client: Any) -> Any:
    """A ``redis.asyncio.Redis`` to the same server, database and credentials, with the same
    timeouts (a partitioned server must fail an async caller as fast as a sync one)."""
    import redis.asyncio as aredis
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    pool = sync_client.connection_pool
    classes = {sconn.SSLConnection: aconn.SSLConnection,
               sconn.UnixDomainSocketConnection: aconn.UnixDomainSocketConnection}  # fmt: skip
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if k not in ("retry", "retry_on_error", "redis_connect_func")}  # fmt: skip
    return aredis.Redis(connection_pool=aconn.ConnectionPool(
        connection_class=classes.get(pool.connection_class, aconn.Connection), **kwargs
    ))  # fmt: skip


async def _translated(storage: Storage, call: Any) -> Any:
    """``await call``, with the client's "did not answer" errors as ``StorageUnavailable``,
    as every sync storage method raises them."""
    try:
        return await call
    except Exception as exc:
        translated = storage.unavailable(exc)
        if translated is not None:
            raise translated from exc
        raise


async def _script(storage: Any, name: str, keys: list, args: list) -> Any:
    from redis.exceptions import NoScriptError

    client = _async_client(storage)
    try:
        return await client.evalsha(SHAS[name], len(keys), *keys, *args)
    except NoScriptError:  # after a restart, failover or SCRIPT FLUSH: it did not run
        await client.script_load(SOURCES[name])
        return await client.evalsha(SHAS[name], len(keys), *keys, *args)


async def register_queue(storage: Any, queue: str) -> None:
    client = _async_client(storage)
    await _translated(storage, client.sadd(storage.global_keys.queues, queue))


async def enqueue(storage: Any, queue: str, job: NewJob) -> StoredEnqueue:
    name, keys, args = storage._enqueue_call(queue, [job])
    raw = await _translated(storage, _script(storage, name, keys, args))
    result: StoredEnqueue = storage._parse_enqueue([job], raw)[0]
    return result


async def get_record(storage: Any, queue: str, job_id: str) -> JobRecord | None:
    client = _async_client(storage)
    key = storage.keys(queue).job(job_id)

    async def read() -> Any:
        async with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.pttl(key)
            return await pipe.execute()

    raw, pttl = await _translated(storage, read())
    return storage._record_of(queue, job_id, raw, pttl, int(time.time() * 1000))


async def wait_for_outcome(
    storage: Any, queue: str, job_id: str, timeout: float
) -> FinalOutcome | None:
    client = _async_client(storage)
    keys = storage.keys(queue)
    done_key = keys.done(job_id)
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        wait = min(remaining, MAX_BLOCK_SECONDS)
        # The reply may take ``wait`` seconds: read it with that much more patience than an
        # ordinary command, as the sync ``blocking_command`` does.
        popped = await _translated(storage, asyncio.wait_for(
            client.blpop([done_key], timeout=wait), wait + 2.0))  # fmt: skip
        if popped:
            return outcome(popped[1])
    # Given up: withdraw the registration as the sync wait does (``unwait.lua``), so the
    # job's finish pushes no reply that nobody reads; a reply pushed meanwhile is taken.
    message = await _translated(
        storage, _script(storage, "unwait", [keys.job(job_id), done_key], [])
    )
    if message:
        return outcome(message)
    # A reply list that expired before it was read: the record has the final word.
    return final_outcome(await get_record(storage, queue, job_id))
