"""Celery-style composition of task functions, built on flows (``flows.py``).

``add.s(1, 2)`` is a *signature*: a task call not sent yet. ``chain(a, b, c)`` (or
``a | b | c``) runs each after the one before and passes its result as the first argument of
the next (``fn.si(...)``: an immutable signature that takes no result). ``group(a, b)`` sends
independent calls. ``chord(group(a, b), cb)`` (or ``group(...) | cb``) runs ``cb`` once every
member finished, with the list of their results, in the group's order, as its first argument.

Why flows: a chain step or chord callback is a flow parent, parked until its children finish
and resolved by whichever worker finishes the last one (or the reaper's sweep), so there is no
polling coordinator to lose, and a crash between steps delays a step, never drops it. A failed
member fails the callback without running it (``ChildFailed``), as a flow does; that and the
member's error are in the callback's dead letter.

``.enqueue()`` returns a handle (``results.py``): ``.get(timeout)`` / ``await .aget(timeout)``
is the canvas' result, ``.status()`` where it stands; ``.enqueue_and_wait(timeout=)`` is both.
The jobs a handle waits on are stored with a registered waiter, as ``enqueue_and_wait``'s job
is, so the wait blocks in the storage instead of polling.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from ..errors import InvalidOption, InvalidPayload
from ..job import EnqueueResult
from ..queue.flows import FlowNode, enqueue_flow, node
from ..serde import TASK_META
from .results import CHAIN, CHORD, CanvasResult, GroupResult, Member

if TYPE_CHECKING:
    from .core import Task

#: Envelope meta key: how a flow parent's task takes its children's results.
RESULTS_META = "takes"
ONE, ALL = "one", "all"


class Signature:
    """One task call, not sent yet (``task.s(...)`` / ``task.si(...)``)."""

    def __init__(self, task: Task, args: tuple, kwargs: dict, *, immutable: bool) -> None:
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.immutable = immutable
        self.job_id: str | None = None

    def set(self, *, job_id: str) -> Signature:
        """This call's job id (enqueueing the same canvas again is then idempotent)."""
        self.job_id = job_id
        return self

    def __or__(self, other: Any) -> Chain:
        return chain(self, other)

    def enqueue(self) -> EnqueueResult:
        return self.task.enqueue(*self.args, job_id=self.job_id, **self.kwargs)

    def _member(self, node_or_id: FlowNode | str, role: str) -> Member:
        job_id = node_or_id if isinstance(node_or_id, str) else node_or_id.job_id
        return Member(self.task.target_queue().name, job_id, self.task.name, role)

    def _node(
        self, children: Sequence[FlowNode] = (), takes: str | None = None, *, waiter: bool = False
    ) -> FlowNode:
        """The flow node of this call. A call that receives results is checked now with a
        placeholder first argument, so a chain that could never bind fails before storing."""
        if takes is not None and not self.immutable:
            try:
                self.task.signature.bind(None, *self.args, **self.kwargs)
            except TypeError as exc:
                raise InvalidPayload(
                    f"task {self.task.name!r}{self.task.signature} (taking the result before"
                    f" it first): {exc}"
                ) from None
            payload: Any = {"args": list(self.args), "kwargs": dict(self.kwargs)}
        else:
            payload = self.task.payload(self.args, self.kwargs)
        options = dict(self.task._options)
        meta = {**(options.pop("meta", None) or {}), TASK_META: self.task.name}
        if takes is not None and not self.immutable:
            meta[RESULTS_META] = takes
        if waiter:  # a handle will wait on this job (see results.py)
            options["waiter"] = True
        queue = self.task.target_queue()
        return node(queue.name, self.job_id or os.urandom(16).hex(), payload,
                    children=children, meta=meta, **options)  # fmt: skip


class _Canvas(abc.ABC):
    """What every canvas does with its ``enqueue()``: wait on the handle it returns, from
    sync or async code (the async send is a thread hop: storing a canvas is sync calls)."""

    @abc.abstractmethod
    def enqueue(self) -> CanvasResult: ...

    def enqueue_and_wait(self, *, timeout: float) -> Any:
        """Enqueue, then ``get(timeout)``: a group's results in order, else the result of
        the last step (chain) or of the callback (chord)."""
        return self.enqueue().get(timeout)

    async def aenqueue(self) -> Any:
        return await sync_to_async(self.enqueue)()

    async def aenqueue_and_wait(self, *, timeout: float) -> Any:
        return await (await self.aenqueue()).aget(timeout)


class Group(_Canvas):
    """Independent calls (``group(a.s(1), b.s(2))``); ``| callback`` makes a chord."""

    def __init__(self, members: Sequence[Signature]) -> None:
        if not members or not all(isinstance(m, Signature) for m in members):
            raise InvalidOption("a group needs one or more signatures (task.s(...))")
        self.members = list(members)

    def __or__(self, callback: Any) -> Chord:
        return chord(self, callback)

    def enqueue(self) -> GroupResult:
        """Send every member; returns their ``EnqueueResult`` list, which is also the group's
        handle (``.get(timeout)``: the results in order)."""
        # Validated all first: a bad member refuses the whole group before anything is sent.
        for m in self.members:
            m.task.payload(m.args, m.kwargs)
        sent = [m.task.using(waiter=True).enqueue(*m.args, job_id=m.job_id, **m.kwargs)
                for m in self.members]  # fmt: skip
        n = len(self.members)
        members = [m._member(r.job_id, f"member {i + 1} of {n}")
                   for i, (m, r) in enumerate(zip(self.members, sent, strict=True))]  # fmt: skip
        queues = {m.task.target_queue().name: m.task.target_queue() for m in self.members}
        return GroupResult(members, queues, sent)


class Chain(_Canvas):
    """Calls run one after the other, each result the next call's first argument."""

    def __init__(self, steps: Sequence[Signature]) -> None:
        if not steps or not all(isinstance(s, Signature) for s in steps):
            raise InvalidOption("a chain needs one or more signatures (task.s(...))")
        self.steps = list(steps)

    def __or__(self, other: Any) -> Chain:
        return chain(*self.steps, other)

    def flow(self) -> FlowNode:
        return self._nodes()[-1]

    def _nodes(self) -> list[FlowNode]:
        nodes: list[FlowNode] = []
        for i, step in enumerate(self.steps):
            kids = nodes[-1:]
            last = i == len(self.steps) - 1
            nodes.append(step._node(kids, ONE if kids else None, waiter=last))
        return nodes

    def enqueue(self) -> CanvasResult:
        """Store the whole chain; returns its handle, which reads as the last step's
        ``EnqueueResult`` (its job's result is the chain's)."""
        nodes = self._nodes()
        n = len(nodes)
        members = [s._member(x, f"step {i + 1} of {n}")
                   for i, (s, x) in enumerate(zip(self.steps, nodes, strict=True))]  # fmt: skip
        return _store(CHAIN, nodes[-1], self.steps, members, [n - 1])


class Chord(_Canvas):
    """A group, then a callback with the list of the group's results."""

    def __init__(self, header: Group, callback: Signature) -> None:
        if not isinstance(header, Group) or not isinstance(callback, Signature):
            raise InvalidOption("chord(group(...), task.s(...))")
        self.header = header
        self.callback = callback

    def flow(self) -> FlowNode:
        kids = [m._node() for m in self.header.members]
        return self.callback._node(kids, ALL, waiter=True)

    def enqueue(self) -> CanvasResult:
        """Store the members and the callback; returns the handle, which reads as the
        callback's ``EnqueueResult`` (its result is the chord's)."""
        root = self.flow()
        n = len(root.children)
        members = [m._member(x, f"member {i + 1} of {n}")
                   for i, (m, x) in enumerate(zip(self.header.members, root.children,
                                                  strict=True))]  # fmt: skip
        members.append(self.callback._member(root, "callback"))
        return _store(CHORD, root, [*self.header.members, self.callback], members, [n])


def _store(
    kind: str,
    root: FlowNode,
    calls: Sequence[Signature],
    members: list[Member],
    awaited: list[int],
) -> CanvasResult:
    from ..queue.core import Queue, get_queue

    # Calls bound to a Queue object (``task.using(queue=Queue(..., storage=s))``) keep their
    # storage; otherwise each queue is the configured one, as get_queue gives.
    explicit = {id(c.task._queue_override.storage): c.task._queue_override.storage
                for c in calls if isinstance(c.task._queue_override, Queue)}  # fmt: skip
    if len(explicit) > 1:
        raise InvalidOption("the calls of one canvas must share a storage")
    storage = next(iter(explicit.values()), None)
    stored = enqueue_flow(root, storage=storage)[root.key]
    queues = {m.queue: (Queue(m.queue, storage=storage) if storage is not None
                        else get_queue(m.queue)) for m in members}  # fmt: skip
    return CanvasResult(kind, members, queues, awaited, stored)


def group(*members: Signature) -> Group:
    return Group(members)


def chain(*steps: Any) -> Chain:
    flat: list[Signature] = []
    for step in steps:
        flat.extend(step.steps if isinstance(step, Chain) else [step])
    return Chain(flat)


def chord(header: Group | Sequence[Signature], callback: Signature) -> Chord:
    return Chord(header if isinstance(header, Group) else Group(list(header)), callback)
