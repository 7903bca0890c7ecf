"""Broadcasts (``storage/broadcast_base.py``): one message, handled once by every group, on every
backend (memory, Redis, SQLite, PostgreSQL), driven by the injected clock."""

from __future__ import annotations

import json

import pytest

from django_jobq.job import AckOutcome
from django_jobq.storage.broadcast_base import (
    NewMessage,
    PublishOutcome,
    Retention,
    Settle,
    SettleKind,
)

B = "user-events"
KEEP = Retention(maxlen=1000)
LEASE = 1000


@pytest.fixture
def store(storage):
    return storage.broadcasts()


def publish(store, *ids: str, retention: Retention = KEEP):
    msgs = [NewMessage(i, json.dumps({"id": i}).encode(), "json") for i in ids]
    return store.publish(B, msgs, retention)


def claim(store, group: str, consumer: str = "w1", count: int = 10, max_stalls: int = 1):
    return store.claim(B, group, consumer, count, LEASE, max_stalls)


def settle(store, group, delivery, kind=SettleKind.COMPLETE, **kw):
    return store.settle(B, group, [Settle(kind, delivery.position, delivery.token, **kw)])[0]


def status(store, group):
    return {s.group: s for s in store.status(B)}[group]


def test_every_group_gets_every_message_once_in_publish_order(store):
    store.subscribe(B, "billing")
    store.subscribe(B, "search")
    publish(store, "m1", "m2", "m3")
    for group in ("billing", "search"):
        got = claim(store, group)
        assert [d.message_id for d in got] == ["m1", "m2", "m3"]
        assert [json.loads(d.payload) for d in got] == [{"id": "m1"}, {"id": "m2"}, {"id": "m3"}]
        assert {d.attempt for d in got} == {1}
        assert [settle(store, group, d) for d in got] == [AckOutcome.COMPLETED] * 3
        assert claim(store, group) == []
        assert store.delivery(B, group, "m2").state == "done"


def test_workers_of_one_group_share_its_messages(store):
    store.subscribe(B, "billing")
    publish(store, *[f"m{i}" for i in range(6)])
    first = claim(store, "billing", "w1", count=4)
    second = claim(store, "billing", "w2", count=4)
    assert len(first) == 4 and len(second) == 2
    assert {d.message_id for d in first} | {d.message_id for d in second} == {
        f"m{i}" for i in range(6)
    }
    assert not {d.message_id for d in first} & {d.message_id for d in second}


def test_publish_deduplicates_by_id(store):
    first = publish(store, "a", "b")
    again = publish(store, "b", "c", "c")
    assert [p.outcome for p in first] == [PublishOutcome.PUBLISHED] * 2
    assert [p.outcome for p in again] == [
        PublishOutcome.DUPLICATE, PublishOutcome.PUBLISHED, PublishOutcome.DUPLICATE,
    ]  # fmt: skip
    assert again[0].position == first[1].position
    assert store.length(B) == 3


def test_a_group_starts_now_from_the_earliest_or_from_a_time(store, clock):
    publish(store, "old")
    clock.advance(1000)
    cut = clock.now
    publish(store, "mid")
    store.subscribe(B, "now")
    store.subscribe(B, "earliest", start="earliest")
    store.subscribe(B, "since", start=cut)
    assert store.subscribe(B, "now", start="earliest") is False  # an existing group keeps its place
    publish(store, "new")
    assert [d.message_id for d in claim(store, "now")] == ["new"]
    assert [d.message_id for d in claim(store, "earliest")] == ["old", "mid", "new"]
    assert [d.message_id for d in claim(store, "since")] == ["mid", "new"]


def test_a_failed_attempt_retries_after_its_delay_with_the_next_attempt_number(store, clock):
    store.subscribe(B, "g")
    publish(store, "m")
    (d,) = claim(store, "g")
    error = json.dumps({"type": "IOError", "message": "down"}).encode()
    assert settle(store, "g", d, SettleKind.RETRY, retry_in=500, error=error) == (
        AckOutcome.RETRYING
    )
    assert status(store, "g").retrying == 1
    assert claim(store, "g") == []
    clock.advance(500)
    (again,) = claim(store, "g")
    assert (again.message_id, again.attempt) == ("m", 2)
    assert again.token > d.token
    state = store.delivery(B, "g", "m")
    assert (state.state, state.attempts) == ("active", 1)
    assert json.loads(state.error)["message"] == "down"


def test_a_message_failed_for_good_is_a_dead_letter_of_that_group_only(store):
    store.subscribe(B, "billing")
    store.subscribe(B, "search")
    publish(store, "m")
    (d,) = claim(store, "billing")
    assert settle(store, "billing", d, SettleKind.DEAD, error=b'{"type":"X"}') == (
        AckOutcome.FAILED
    )
    (dead,) = store.dead_letters(B, "billing")
    assert (dead.message_id, dead.attempts, json.loads(dead.payload)) == ("m", 1, {"id": "m"})
    assert (status(store, "billing").dead, status(store, "search").dead) == (1, 0)
    assert [x.message_id for x in claim(store, "search")] == ["m"]

    assert store.retry_dead(B, "billing") == 1
    (again,) = claim(store, "billing")
    assert (again.message_id, again.attempt) == ("m", 1)
    assert store.dead_letters(B, "billing") == []


def test_purge_dead_deletes_the_groups_dead_letters(store):
    store.subscribe(B, "g")
    publish(store, "a", "b")
    for d in claim(store, "g"):
        settle(store, "g", d, SettleKind.DEAD, error=b"{}")
    assert store.purge_dead(B, "g") == 2
    assert store.dead_letters(B, "g") == [] and status(store, "g").dead == 0


def test_a_lapsed_lease_is_taken_over_and_fences_the_old_holder(store, clock):
    store.subscribe(B, "billing")
    store.subscribe(B, "search")
    publish(store, "m")
    (held,) = claim(store, "billing", "dead-worker")
    (other,) = claim(store, "search", "w3")
    clock.advance(LEASE + 1)
    (taken,) = claim(store, "billing", "w2")
    assert (taken.message_id, taken.attempt) == ("m", 1)  # a stall uses no attempt
    assert taken.token > held.token
    assert settle(store, "billing", held) == AckOutcome.LEASE_LOST
    assert store.report(B, "billing", held.position, held.token, b"50") is False
    assert store.heartbeat(B, "billing", [(held.position, held.token)], LEASE) == [held.position]
    assert settle(store, "billing", taken) == AckOutcome.COMPLETED
    # The other group's lease lapsed too, but nothing there was taken over until it claims.
    assert settle(store, "search", other) == AckOutcome.COMPLETED


def test_stalling_past_max_stalls_makes_a_dead_letter(store, clock):
    store.subscribe(B, "g")
    publish(store, "m")
    claim(store, "g", "w1", max_stalls=1)
    clock.advance(LEASE + 1)
    assert len(claim(store, "g", "w2", max_stalls=1)) == 1
    clock.advance(LEASE + 1)
    assert claim(store, "g", "w3", max_stalls=1) == []
    assert [d.message_id for d in store.dead_letters(B, "g")] == ["m"]


def test_a_heartbeat_keeps_the_lease(store, clock):
    store.subscribe(B, "g")
    publish(store, "m")
    (d,) = claim(store, "g")
    clock.advance(LEASE - 100)
    assert store.heartbeat(B, "g", [(d.position, d.token)], LEASE) == []
    clock.advance(LEASE - 100)
    assert claim(store, "g", "w2") == []
    assert settle(store, "g", d) == AckOutcome.COMPLETED


def test_released_messages_come_back_at_once_without_using_an_attempt(store):
    store.subscribe(B, "g")
    publish(store, "m")
    (d,) = claim(store, "g")
    assert settle(store, "g", d, SettleKind.RELEASE) == AckOutcome.RELEASED
    (again,) = claim(store, "g")
    assert (again.message_id, again.attempt) == ("m", 1)


def test_progress_is_kept_with_the_delivery_and_fenced(store):
    store.subscribe(B, "g")
    publish(store, "m")
    (d,) = claim(store, "g")
    assert store.report(B, "g", d.position, d.token, b'{"done":3}') is True
    assert json.loads(store.delivery(B, "g", "m").progress) == {"done": 3}
    assert store.report(B, "g", d.position, d.token + 1, b"9") is False


def test_status_counts_lag_active_retrying_and_dead_per_group(store):
    store.subscribe(B, "fast")
    store.subscribe(B, "slow")
    publish(store, "a", "b", "c", "d")
    a, b, c = claim(store, "fast", count=3)
    settle(store, "fast", a)
    settle(store, "fast", b, SettleKind.RETRY, retry_in=10_000, error=b"{}")
    settle(store, "fast", c, SettleKind.DEAD, error=b"{}")
    claim(store, "fast", count=1)  # d: active
    fast, slow = status(store, "fast"), status(store, "slow")
    assert (fast.lag, fast.active, fast.retrying, fast.dead, fast.missed) == (0, 1, 1, 1, 0)
    assert fast.pending == 2
    assert (slow.lag, slow.active, slow.retrying, slow.dead) == (4, 0, 0, 0)
    assert store.names() == [B]


def test_a_group_that_falls_behind_the_retention_misses_the_dropped_messages(store):
    store.subscribe(B, "fast")
    store.subscribe(B, "slow")
    cap = Retention(maxlen=3)
    publish(store, "m1", "m2", retention=cap)
    for d in claim(store, "fast"):
        settle(store, "fast", d)
    (held,) = claim(store, "slow", count=1)  # m1 active in slow, m2 unread
    publish(store, "m3", "m4", "m5", retention=cap)  # drops m1 and m2
    assert store.length(B) == 3
    fast, slow = status(store, "fast"), status(store, "slow")
    assert (fast.missed, fast.lag) == (0, 3)
    assert (slow.missed, slow.lag, slow.active) == (2, 3, 0)
    assert settle(store, "slow", held) == AckOutcome.LEASE_LOST
    assert [d.message_id for d in claim(store, "slow")] == ["m3", "m4", "m5"]
    assert store.delivery(B, "slow", "m1").state == "unknown"
    # The dropped ids are free again.
    assert publish(store, "m1", retention=cap)[0].outcome is PublishOutcome.PUBLISHED


def test_retention_by_age_drops_old_messages_at_publish(store, clock):
    store.subscribe(B, "g")
    publish(store, "old", retention=Retention(max_age=1000))
    clock.advance(1500)
    publish(store, "new", retention=Retention(max_age=1000))
    assert store.length(B) == 1
    assert [d.message_id for d in claim(store, "g")] == ["new"]
    assert status(store, "g").missed == 1


def test_a_dead_letter_outlives_its_message_but_cannot_be_retried(store):
    store.subscribe(B, "g")
    publish(store, "m", retention=Retention(maxlen=1))
    (d,) = claim(store, "g")
    settle(store, "g", d, SettleKind.DEAD, error=b"{}")
    publish(store, "n", retention=Retention(maxlen=1))
    assert [x.message_id for x in store.dead_letters(B, "g")] == ["m"]
    assert store.retry_dead(B, "g") == 0
    assert status(store, "g").missed == 0


def test_claiming_for_an_unknown_group_is_an_error(store):
    publish(store, "m")
    with pytest.raises(LookupError):
        claim(store, "nobody")


def test_unsubscribe_forgets_the_group(store):
    store.subscribe(B, "g")
    publish(store, "m")
    claim(store, "g")
    assert store.unsubscribe(B, "g") is True
    assert [s.group for s in store.status(B)] == []
    assert store.unsubscribe(B, "g") is False


def test_single_publishes_keep_retention_exact_and_deduplicate(store):
    """One message per call (the database backends' hand-written path): each repeat is a
    duplicate at the first one's position, maxlen holds after every call, and what the
    retention drops before the group read it counts as missed."""
    store.subscribe(B, "g", "earliest")
    cap = Retention(maxlen=3)
    for i in range(8):
        first = publish(store, f"m{i}", retention=cap)[0]
        again = publish(store, f"m{i}", retention=cap)[0]
        assert first.outcome is PublishOutcome.PUBLISHED
        assert (again.outcome, again.position) == (PublishOutcome.DUPLICATE, first.position)
        assert store.length(B) == min(i + 1, 3)
    g = status(store, "g")
    assert (g.lag, g.missed) == (3, 5)
    assert [d.message_id for d in claim(store, "g")] == ["m5", "m6", "m7"]
    # the first publish of a new broadcast (no counter yet) and a dropped id published again
    assert store.publish("other", [NewMessage("x", b"1", "json")], cap)[0].outcome is (
        PublishOutcome.PUBLISHED
    )
    assert publish(store, "m0", retention=cap)[0].outcome is PublishOutcome.PUBLISHED
