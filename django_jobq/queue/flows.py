"""Job flows: a parent job that runs once its children (on any queues) have finished, with their
results; chains (A, then B with A's result) are flows of one child per step.

How it holds under crashes, with no cross-queue atomic step (queues live in different Redis
Cluster slots):

- A parent is stored *parked*: scheduled at ``PARKED_MS`` (the year 9000), so nothing claims
  it, with its children's ids in its job envelope (``serde.py``).
- Children are stored before their parents (post-order), so every parent that exists has all
  its children stored. A crash midway leaves children without a parent, never a parent waiting
  for a child that will not come; enqueueing the same flow again (same ids) is idempotent.
- A parent is *resolved* when all its children are finished: the children's outcomes are
  written into its envelope and its due time moved to now, in one atomic in-place update of
  the waiting job (the ``update_data`` + ``update_run_at`` enqueue). Resolving is idempotent:
  an update of a job that is no longer waiting changes nothing.
- Resolution is triggered by the worker that finishes a child (fast path, from the child's
  envelope, which names its parents), and by a sweep of parked parents that the reaper and
  every worker run (so a worker that crashed between a child's verdict and the trigger delays
  a parent by one sweep, never forever).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FlowError, InvalidOption
from ..job import (
    PARKED_FLOOR,
    PARKED_MS,
    EnqueueOutcome,
    EnqueueResult,
    JobOptions,
    JobRecord,
    JobUpdate,
    NewJob,
    RunAtUpdate,
    decode_error,
)
from ..observability import tracing
from ..serde import META, PAYLOAD, is_enveloped, unwrap
from ..states import TERMINAL_STATES, JobState
from ..storage.base import Storage
from ..validation import validate_job_id, validate_queue_name

logger = logging.getLogger("django_jobq.flows")

FAIL, RELEASE = "fail", "release"
_POLICIES = (FAIL, RELEASE)
#: Parked parents one sweep resolves per queue (more wait for the next sweep).
SWEEP_LIMIT = 200
#: Age of a parent after which a child without a record is lost rather than still coming.
LOST_GRACE_MS = 10 * 60 * 1000

Key = tuple[str, str]  # (queue, job id)


@dataclass(eq=False)
class FlowNode:
    """One job of a flow. Build with ``node()`` / ``chain()``; store with ``enqueue_flow``."""

    queue: str
    job_id: str
    payload: Any = None
    children: list[FlowNode] = field(default_factory=list)
    on_child_failure: str = FAIL
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.queue, self.job_id)


def node(
    queue: str,
    job_id: str | None = None,
    payload: Any = None,
    *,
    children: Iterable[FlowNode] = (),
    on_child_failure: str = FAIL,
    **options: Any,
) -> FlowNode:
    """A flow job: ``queue``'s handler runs ``payload`` once every child finished.

    ``on_child_failure``: ``"fail"`` (default) fails the parent for good without running it
    when a child failed, was cancelled or vanished (``ChildFailed``); ``"release"`` runs it
    anyway, each child's outcome in ``job.children``. Options are ``Queue.enqueue``'s.
    """
    if on_child_failure not in _POLICIES:
        raise InvalidOption(
            f"on_child_failure must be 'fail' or 'release', got {on_child_failure!r}"
        )
    job_id = os.urandom(16).hex() if job_id is None else validate_job_id(job_id)
    kids = list(children)
    for kid in kids:
        if not isinstance(kid, FlowNode):
            raise InvalidOption(f"children must be flow nodes, got {type(kid).__name__}")
    return FlowNode(validate_queue_name(queue), job_id, payload, kids, on_child_failure, options)


def chain(*steps: FlowNode) -> FlowNode:
    """A then B then C: each step waits for the one before and gets its result as
    ``job.previous_result``. Returns the last step (the one to wait for)."""
    if not steps:
        raise InvalidOption("a chain needs at least one step")
    previous: FlowNode | None = None
    for step in steps:
        if not isinstance(step, FlowNode):
            raise InvalidOption(f"chain steps must be flow nodes, got {type(step).__name__}")
        if previous is not None:
            step.children.append(previous)
        previous = step
    assert previous is not None
    return previous


def plan(roots: Sequence[FlowNode]) -> list[FlowNode]:
    """Every node once, children before parents. Raises FlowError on a cycle or on one id
    defined twice with different contents: nothing is stored for a flow that cannot run."""
    nodes: dict[Key, FlowNode] = {}
    order: list[FlowNode] = []
    done: set[Key] = set()
    path: list[Key] = []

    def visit(n: FlowNode) -> None:
        seen = nodes.setdefault(n.key, n)
        if seen is not n and _shape(seen) != _shape(n):
            raise FlowError(f"job {n.queue}/{n.job_id} appears twice in the flow, differently")
        if n.key in done:
            return
        if n.key in path:
            cycle = " -> ".join(f"{q}/{i}" for q, i in [*path[path.index(n.key) :], n.key])
            raise FlowError(f"the flow has a cycle: {cycle}")
        path.append(n.key)
        for kid in n.children:
            visit(kid)
        path.pop()
        done.add(n.key)
        order.append(n)

    for root in roots:
        visit(root)
    return order


def _shape(n: FlowNode) -> tuple:
    return (repr(n.payload), n.on_child_failure, sorted(n.options.items(), key=str),
            [k.key for k in n.children])  # fmt: skip


def enqueue_flow(
    roots: FlowNode | Sequence[FlowNode], *, storage: Storage | None = None
) -> dict[Key, EnqueueResult]:
    """Store a flow: every job, children first. Returns each job's enqueue outcome by
    (queue, id). A job whose id already exists is not stored again (the usual deduplication):
    a parent then waits for the existing child's outcome.

    Traced (docs/observability.md): one ``send flow`` span for the call, a ``send`` span per
    job under it, and each parent's attempt linked to its children's ``send`` spans."""
    root_list = [roots] if isinstance(roots, FlowNode) else list(roots)
    order = plan(root_list)
    if tracing.active():
        with tracing.flow_span(order[-1].queue, len(order)):
            return _enqueue_flow(order, storage, traced=True)
    return _enqueue_flow(order, storage, traced=False)


def _enqueue_flow(
    order: list[FlowNode], storage: Storage | None, *, traced: bool
) -> dict[Key, EnqueueResult]:
    from .core import Queue, get_queue

    queues = {q: (Queue(q, storage=storage) if storage is not None else get_queue(q))
              for q in {n.queue for n in order}}  # fmt: skip

    def where(n: FlowNode) -> str:
        """The physical queue that will hold ``n`` (a sharded queue's partition): parents
        and children are found and released by storage steps on that name."""
        return queues[n.queue].partition_for(_routing_key(n))

    parents: dict[Key, list[list[str]]] = {}
    for n in order:
        for kid in n.children:
            parents.setdefault(kid.key, []).append([where(n), n.job_id])
    built = []
    spans: dict[Key, Any] = {}
    carriers: dict[Key, Mapping[str, str]] = {}
    for n in order:  # every job is validated before the first is stored
        options = dict(n.options)
        meta: dict[str, Any] = dict(options.pop("meta", None) or {})  # task functions' name
        if n.key in parents:
            meta["parents"] = parents[n.key]
        if traced and n.key not in spans:
            spans[n.key], carriers[n.key] = tracing.start_producer(n.queue, n.job_id)
            if carriers[n.key]:
                meta[tracing.TRACE_META] = carriers[n.key]
            links = [carriers[k.key] for k in _unique(n.children) if carriers.get(k.key)]
            if links:
                meta[tracing.LINKS_META] = links
        if n.children:
            meta["flow"] = {
                "children": [[where(k), k.job_id] for k in _unique(n.children)],
                "on_child_failure": n.on_child_failure,
                "due": _own_due(options),
            }
            options["run_at"] = dt.datetime.fromtimestamp(PARKED_MS / 1000, tz=dt.UTC)
        if traced and carriers[n.key] is tracing.UNSAMPLED:  # marked as sent unsampled
            job = queues[n.queue]._build_traced(n.job_id, n.payload, {**options, "meta": meta},
                                                tracing.UNSAMPLED)  # fmt: skip
        else:
            job = queues[n.queue].build(n.job_id, n.payload, meta=meta, **options)
        built.append((n, job))
    results: dict[Key, EnqueueResult] = {}
    try:
        for n, job in built:
            results[n.key] = queues[n.queue].submit(job)
            if n.key in spans:
                spans.pop(n.key).end()
    finally:
        for span in spans.values():
            span.end()  # the jobs not reached: an error midway
    # Children that had finished before their parent was stored (duplicates of old jobs, or
    # quick ones) have no one left to trigger the parent: look now. Not when jobs are still
    # pending in a journal (sent when the transaction commits): then there is nothing to see.
    if all(r.outcome is not EnqueueOutcome.PENDING for r in results.values()):
        for n in order:
            if n.children:
                resolve(queues[n.queue].storage, where(n), n.job_id)
    return results


def _routing_key(n: FlowNode) -> str:
    """``sharding.routing_key`` of the job ``n`` will be (dedup key, else group, else id)."""
    for name in ("dedup_key", "group"):
        if n.options.get(name) is not None:
            return str(n.options[name])
    return n.job_id


def _unique(children: Sequence[FlowNode]) -> list[FlowNode]:
    return list({k.key: k for k in children}.values())  # first-seen order


def _own_due(options: dict[str, Any]) -> int | None:
    """The parent's own due time (run_at / delay), applied when it is released."""
    run_at, delay = options.pop("run_at", None), options.pop("delay", None)
    if run_at is not None:
        if not isinstance(run_at, dt.datetime) or run_at.tzinfo is None:
            raise InvalidOption("run_at must be a timezone-aware datetime")
        return int(run_at.timestamp() * 1000)
    if delay is not None:
        ms = int(delay.total_seconds() * 1000) if isinstance(delay, dt.timedelta) else delay
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise InvalidOption(f"delay must be milliseconds or a timedelta, got {delay!r}")
        return int(time.time() * 1000) + ms
    return None


# --- resolving parents -----------------------------------------------------------------------


def _decoded(record: JobRecord) -> tuple[Any, dict[str, Any]] | None:
    from ..serde import serde_for

    if record.payload is None or not is_enveloped(record.content_type):
        return None
    try:
        value = serde_for(record.content_type).loads(record.payload)
    except Exception:  # noqa: BLE001 - a foreign write is not a flow
        return None
    return unwrap(record.content_type, value)


def _child_outcome(storage: Storage, queue: str, job_id: str, lost_ok: bool) -> list[Any] | None:
    """[queue, id, state, value, error] of a finished child; None while it still runs, or
    while a missing child may still arrive (``lost_ok`` False)."""
    from ..serde import serde_for

    record = storage.get_record(queue, job_id)
    if record is None and not lost_ok:
        return None
    if record is None:
        lost = {"type": "ChildLost", "message": f"job {queue}/{job_id} has no record (expired "
                "or deleted before its parent was resolved)"}  # fmt: skip
        return [queue, job_id, JobState.FAILED.value, None, lost]
    if record.state not in TERMINAL_STATES:
        return None
    value = None
    if record.state is JobState.COMPLETED and record.result is not None:
        try:
            value = serde_for(record.content_type).loads(record.result)
        except Exception:  # noqa: BLE001 - an unreadable result is handed over as text
            value = bytes(record.result).decode("utf-8", "replace")
    return [queue, job_id, record.state.value, value, decode_error(record.error)]


def resolve(storage: Storage, queue: str, job_id: str, *, now_ms: int | None = None) -> bool:
    """Release the parked parent ``queue/job_id`` if all its children finished; True when it
    was released now. Safe to call any number of times, from any process.

    A child with no record counts as lost (failed) only once the parent is older than
    ``LOST_GRACE_MS``: until then it may be a child still on its way (sent when a journal's
    transaction commits, or re-created by ``jobq_reconcile`` after Redis lost it)."""
    record = storage.get_record(queue, job_id)
    if record is None or record.state is not JobState.SCHEDULED:
        return False
    if (record.run_at or 0) < PARKED_FLOOR:
        return False
    decoded = _decoded(record)
    flow = decoded[1].get("flow") if decoded else None
    if not isinstance(flow, dict) or "results" in flow:
        return False
    now = int(time.time() * 1000) if now_ms is None else now_ms
    lost_ok = now - record.created_at >= LOST_GRACE_MS
    outcomes = []
    for child_queue, child_id in flow.get("children", []):
        outcome = _child_outcome(storage, child_queue, child_id, lost_ok)
        if outcome is None:
            return False
        outcomes.append(outcome)
    payload, meta = decoded  # type: ignore[misc]
    flow["results"] = outcomes
    from ..serde import serde_for

    body = serde_for(record.content_type).dumps({PAYLOAD: payload, META: meta})
    options = JobOptions(
        max_attempts=record.max_attempts, result_ttl=record.result_ttl,
        min_backoff=record.min_backoff, max_backoff=record.max_backoff,
        max_stalls=record.max_stalls, priority=record.priority,
    )  # fmt: skip
    release = NewJob(
        job_id, body, options, run_at=flow.get("due"), content_type=record.content_type,
        update=JobUpdate(data=True, run_at=RunAtUpdate.YES),
    )  # fmt: skip
    stored = storage.enqueue(queue, release)
    logger.debug("[%s/%s] flow parent resolved: %s", queue, job_id, stored.outcome.value)
    return stored.outcome is EnqueueOutcome.UPDATED


def resolve_parked(storage: Storage, queue: str, limit: int = SWEEP_LIMIT) -> int:
    """The sweep: resolve every parked parent of ``queue`` whose children all finished."""
    released = 0
    for job_id in storage.parked(queue, limit):
        try:
            released += resolve(storage, queue, job_id)
        except Exception as exc:  # one broken parent must not stop the others
            logger.warning("[%s/%s] flow parent not resolved: %s", queue, job_id, exc)
    return released


def parents_of(meta: dict[str, Any]) -> list[Key]:
    """Parents named in a finished child's envelope ``meta`` (the worker's fast path)."""
    parents = meta.get("parents") or []
    return [(str(p[0]), str(p[1])) for p in parents if isinstance(p, list) and len(p) == 2]
