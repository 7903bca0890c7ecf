"""Model-based test of broadcasts (``storage/broadcast_base.py``), on every backend.

A ``hypothesis.stateful`` rule machine drives one broadcast of a real backend's
``storage.broadcasts()`` (memory, Redis, Redis Cluster, SQLite, PostgreSQL; time from the fake
clock) and ``reference.ModelBroadcast`` with the same operations, and compares them after every
step. The rules: publish (a few messages, duplicates among them, with retention by count and
age applied in the same step), subscribe a group (from now, from the earliest message, or
from a time) and unsubscribe it, claim for a group (due retries, lapsed leases taken over with
a stall or made dead letters past ``max_stalls``, then unread messages) and settle what was
claimed (complete, retry, dead, release), heartbeats and progress reports, with current and
stale tokens, time passing, and the dead-letter operations (retry some or all, purge).

After each step, per group: the status (lag, active, retrying, dead, missed), the delivery
state and attempts of every message id, the dead letters, and the length of the log must
agree with the model; every claim hands out a token its delivery never had (fencing), a
settle, heartbeat or report is accepted only from the newest token, and exactly the model's
current leases are held. Known disagreements are reproduced in ``test_findings.py``.

Size: ``EXAMPLES`` below (``JOBQ_MODEL_LONG=1`` runs many more, as for the job machine).
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_jobq.storage.broadcast_base import NewMessage, Retention, Settle, SettleKind
from tests.conftest import FakeClock, make_storage

from .reference import ModelBroadcast

LONG = os.environ.get("JOBQ_MODEL_LONG") == "1"
GROUPS = ("billing", "search")
MESSAGES = ("m1", "m2", "m3", "m4", "m5")
ERROR = b'{"type": "IOError", "message": "down"}'
EXAMPLES = {"memory": 200, "redis": 80, "redis-cluster": 15, "sqlite": 25, "postgres": 25}
KINDS = {
    "complete": SettleKind.COMPLETE,
    "retry": SettleKind.RETRY,
    "dead": SettleKind.DEAD,
    "release": SettleKind.RELEASE,
}


def size(backend: str) -> settings:
    examples = 1000 if LONG else EXAMPLES.get(backend, 12)
    return settings(
        max_examples=int(os.environ.get("JOBQ_MODEL_EXAMPLES", examples)),
        stateful_step_count=60 if LONG else 30,
        deadline=None,
        derandomize=not LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None,
        report_multiple_bugs=False,
        phases=list(Phase) if LONG else [Phase.explicit, Phase.reuse, Phase.generate],
    )


class BroadcastMachine(RuleBasedStateMachine):
    storage = None  # set per backend by the test below
    clock: FakeClock

    def __init__(self) -> None:
        super().__init__()
        self.name = f"bc-{uuid.uuid4().hex[:12]}"  # hypothesis examples share no state
        self.store = self.storage.broadcasts()
        self.model = ModelBroadcast(now=self.clock.now)
        # Every lease ever given: (group, seq, position, token); stale ones stay.
        self.leases: list[tuple[str, int, str, int]] = []
        # Tokens handed out per (group, position), across unsubscribe and subscribe again.
        self.tokens: dict[tuple[str, str], set[int]] = {}
        self.lease_ms: dict[tuple[str, int, int], int] = {}  # lease -> its deadline

    def teardown(self) -> None:
        try:
            for group in list(self.model.groups):
                self.store.unsubscribe(self.name, group)
        finally:
            super().teardown()

    def _tick(self, ms: int) -> None:
        self.clock.advance(ms)
        self.model.now = self.clock.now

    # -- rules -----------------------------------------------------------------------------

    @initialize(group=st.sampled_from(GROUPS), start=st.sampled_from(["earliest", "now"]))
    def start(self, group: str, start: str) -> None:
        """Every example has a group to claim for (hypothesis may leave subscribe out)."""
        assert self.store.subscribe(self.name, group, start) == self.model.subscribe(group, start)

    @rule(
        ids=st.lists(st.sampled_from(MESSAGES), min_size=1, max_size=3),
        maxlen=st.sampled_from([None, 2, 3]),
        max_age=st.sampled_from([None, 2_000]),
    )
    def publish(self, ids: list[str], maxlen: int | None, max_age: int | None) -> None:
        # One millisecond per publish: positions within one millisecond then stay few, so the
        # order of Redis's entry ids (compared as strings where they tie) is publish order.
        self._tick(1)
        items = [(i, f'{{"id": "{i}", "at": {self.clock.now}}}'.encode()) for i in ids]
        expected = self.model.publish(items, maxlen, max_age)
        got = self.store.publish(
            self.name,
            [NewMessage(i, p, "json") for i, p in items],
            Retention(maxlen=maxlen, max_age=max_age),
        )
        assert [(g.message_id, g.outcome) for g in got] == [
            (i, outcome) for (i, _), (outcome, _) in zip(items, expected, strict=True)
        ], "publish outcomes"
        for g, (outcome, message) in zip(got, expected, strict=True):
            if outcome == "published":
                message.position = g.position
            else:
                assert g.position == message.position, f"{g.message_id}: the holder's position"

    @rule(
        group=st.sampled_from(GROUPS),
        start=st.sampled_from(["now", "earliest", "past"]),
        leave=st.booleans(),
    )
    def subscribe(self, group: str, start: str, leave: bool) -> None:
        """Subscribe a group (from a time: ``past``, 1.5 s ago), or (``leave``) unsubscribe
        it."""
        if leave:
            assert self.store.unsubscribe(self.name, group) == self.model.unsubscribe(group)
            # The old group's leases stay: they must be refused by the group subscribed again
            # (test_findings.py::test_a_group_subscribed_again_fences_off_its_old_workers).
            return
        at = self.clock.now - 1_500 if start == "past" else start
        assert self.store.subscribe(self.name, group, at) == self.model.subscribe(group, at)

    @precondition(lambda self: self.model.groups)
    @rule(
        pick=st.integers(0, 10),
        consumer=st.sampled_from(["w1", "w2"]),
        count=st.sampled_from([1, 2, 5]),
        lease_ms=st.sampled_from([1_000, 5_000]),
        max_stalls=st.sampled_from([1, 0]),
        then=st.sampled_from([None, *KINDS]),
    )
    def claim(
        self, pick: int, consumer: str, count: int, lease_ms: int, max_stalls: int, then
    ) -> None:
        """A worker of a group claims, and (``then``) settles the first delivery at once."""
        group = sorted(self.model.groups)[pick % len(self.model.groups)]
        expected = self.model.claim(group, count, lease_ms, max_stalls)
        got = self.store.claim(self.name, group, consumer, count, lease_ms, max_stalls)
        assert [(d.message_id, d.attempt) for d in got] == [
            (d.message.message_id, d.failures + 1) for d in expected
        ], f"claim for {group}"
        for d, g in zip(expected, got, strict=True):
            assert g.position == d.message.position, f"{g.message_id}: position"
            assert bytes(g.payload) == d.message.payload
            seen = self.tokens.setdefault((group, g.position), set())
            assert g.token not in seen, (
                f"{group}: token {g.token} of {g.message_id} was given out before: a stale "
                "worker holding it would pass the fence"
            )
            seen.add(g.token)
            self.model.claimed(d, g.token)
            self.leases.append((group, d.message.seq, g.position, g.token))
        if then is not None and got:
            self._settle(self.leases[-len(got)], then, 500)

    @precondition(lambda self: self.leases)
    @rule(
        pick=st.integers(0, 10_000),
        stale=st.booleans(),
        kind=st.sampled_from([*KINDS, "heartbeat", "report"]),
        retry_in=st.sampled_from([0, 500, 3_000]),
    )
    def settle(self, pick: int, stale: bool, kind: str, retry_in: int) -> None:
        """A verdict, heartbeat or progress report on a lease held now, or (``stale``, or
        when none is) on any lease given once."""
        current = [le for le in self.leases if self.model._held(le[0], le[1], le[3])]
        leases = self.leases if stale or not current else current
        self._settle(leases[pick % len(leases)], kind, retry_in)

    def _settle(self, lease: tuple[str, int, str, int], kind: str, retry_in: int) -> None:
        group, seq, position, token = lease
        subscribed = group in self.model.groups
        if kind == "heartbeat":
            held = self.model.heartbeat(group, seq, token, 5_000)
            if subscribed:
                lost = self.store.heartbeat(self.name, group, [(position, token)], 5_000)
                assert (lost == []) == held, f"heartbeat {lease}: held={held}, lost={lost}"
            return
        if kind == "report":
            held = self.model._held(group, seq, token) is not None
            if subscribed:
                got = self.store.report(self.name, group, position, token, b'{"done": 1}')
                assert got == held, f"report {lease}: held={held}"
            return
        if not subscribed:
            return  # an unknown group's verdicts are an error, not a model question
        expected = self.model.settle(group, seq, token, kind, retry_in)
        verdict = Settle(KINDS[kind], position, token, retry_in=retry_in, error=ERROR)
        (got,) = self.store.settle(self.name, group, [verdict])
        assert got == expected, f"{kind} of {lease}: got {got}"

    @rule(ms=st.sampled_from([1, 500, 1_001, 2_500, 6_000]))
    def time_passes(self, ms: int) -> None:
        """Leases lapse, retries come due, messages age (retention applies at publish)."""
        self._tick(ms)

    @precondition(lambda self: self.model.groups)
    @rule(pick=st.integers(0, 10), op=st.sampled_from(["retry_all", "retry_one", "purge"]))
    def dead_letters(self, pick: int, op: str) -> None:
        group = sorted(self.model.groups)[pick % len(self.model.groups)]
        if op == "purge":
            assert self.store.purge_dead(self.name, group) == self.model.purge_dead(group)
            return
        seqs = positions = None
        if op == "retry_one":
            dead = [
                (seq, d.message.position)
                for seq, d in sorted(self.model.groups[group].deliveries.items())
                if d.state == "dead"
            ]  # fmt: skip
            if not dead:
                return
            seq, position = dead[pick % len(dead)]
            seqs, positions = {seq}, [position]
        moved = self.store.retry_dead(self.name, group, positions)
        assert moved == self.model.retry_dead(group, seqs), f"retry_dead {group} {positions}"

    # -- agreement -------------------------------------------------------------------------

    @invariant()
    def groups_agree(self) -> None:
        status = {s.group: s for s in self.store.status(self.name)}
        assert sorted(status) == sorted(self.model.groups), "groups"
        assert self.store.length(self.name) == len(self.model.messages), "length"
        for group in self.model.groups:
            s = status[group]
            got = (s.lag, s.active, s.retrying, s.dead, s.missed)
            assert got == self.model.status(group), f"{group}: lag, active, retrying, dead, missed"
            for message_id in MESSAGES:
                d = self.store.delivery(self.name, group, message_id)
                assert (d.state, d.attempts) == self.model.delivery_state(group, message_id), (
                    f"{group}: delivery of {message_id}"
                )
            dead = self.store.dead_letters(self.name, group)
            assert [x.failed_at for x in dead] == sorted(x.failed_at for x in dead)
            assert sorted((x.message_id, x.attempts, x.failed_at) for x in dead) == sorted(
                (d.message.message_id, d.failures, d.failed_at)
                for d in self.model.groups[group].deliveries.values()
                if d.state == "dead"
            ), f"{group}: dead letters"

    @invariant()
    def only_current_leases_are_held(self) -> None:
        """Heartbeat every lease ever given, to its own deadline (extending nothing): exactly
        the model's current ones are held."""
        for group, seq, position, token in self.leases:
            if group not in self.model.groups:
                continue
            d = self.model._held(group, seq, token)
            if d is not None and d.lease_until <= self.model.now:
                continue  # lapsed: held until a claim takes it over; a heartbeat would revive it
            ms = d.lease_until - self.model.now if d is not None else 1_000
            lost = self.store.heartbeat(self.name, group, [(position, token)], ms)
            assert (lost == []) == (d is not None), f"{group} {position} token {token}"


@pytest.mark.slow
def test_broadcasts_agree_with_the_model(backend, request):
    clock = FakeClock()
    machine = type(
        f"BroadcastMachine_{backend}",
        (BroadcastMachine,),
        {"storage": make_storage(backend, request, clock), "clock": clock},
    )
    run_state_machine_as_test(machine, settings=size(backend))


def test_a_settle_of_a_lease_the_group_gave_is_refused_after_a_newer_claim(backend, request):
    """A replay: a lapsed lease taken over; the old token is refused, the new one settles."""
    clock = FakeClock()
    cls = type(
        f"BroadcastReplay_{backend}",
        (BroadcastMachine,),
        {"storage": make_storage(backend, request, clock), "clock": clock},
    )
    m = cls()
    request.addfinalizer(m.teardown)
    for step, *args in [
        (m.start, "billing", "earliest"),
        (m.publish, ["m1", "m2"], None, None),
        (m.claim, 0, "w1", 1, 1_000, 1, None),
        (m.time_passes, 1_001),
        (m.claim, 0, "w2", 1, 1_000, 1, None),  # m1 taken over (a stall)
        (m.settle, 0, True, "complete", 0),  # the old holder: lease lost
        (m.settle, 1, False, "retry", 500),
        (m.time_passes, 500),
        (m.claim, 0, "w1", 5, 1_000, 1, "dead"),  # m1 again (attempt 2), dead; then m2
        (m.dead_letters, 0, "retry_all"),
    ]:
        step(*args)
        m.groups_agree()
        m.only_current_leases_are_held()
