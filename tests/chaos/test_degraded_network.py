"""Fault 7: a proxy adding 200 ms to every round trip (100 ms each way) and resetting the
connection of 5 % of requests, between every client (producer, workers, reaper) and Redis."""

from __future__ import annotations

import time

from django_jobq.errors import StorageUnavailable

from .conftest import completed, sized

LATENCY_MS = 200  # per round trip
RESET_RATE = 0.05


def test_latency_and_connection_resets_lose_nothing(
    scale, private_redis, fault_proxy, supervise, ledger, queue_of, report
):
    n = sized(scale, 800, 20_000)
    server = private_redis()
    proxy = fault_proxy(server.port)
    proxy.degrade(latency_ms=LATENCY_MS / 2, reset_rate=RESET_RATE)
    queue = queue_of("chaos-ledger", proxy.url)
    ids = [f"net-{i}" for i in range(n)]
    started = time.monotonic()
    retried = 0
    for i in range(0, n, 500):  # a refused chunk is sent again: ids make that safe
        chunk = ids[i : i + 500]
        while True:
            try:
                results = queue.enqueue_many(
                    [{"id": j, "payload": {"seconds": 0.01}, "max_stalls": 50} for j in chunk]
                )
                break
            except StorageUnavailable:
                retried += 1
        ledger.record_enqueued(r.job_id for r in results)
    workers = supervise(
        ["runworker", "chaos-ledger", "-c", "32", "--lease", "5000", "--reap-interval", "2"], 4,
        redis_url=proxy.url,
    )  # fmt: skip
    supervise(["runreaper", "--interval", "1"], 1, redis_url=proxy.url)
    direct = queue_of("chaos-ledger", server.url)
    deadline = time.monotonic() + sized(scale, 240, 1200)
    while time.monotonic() < deadline and len(completed(direct, ids)) < n:
        time.sleep(1)
    elapsed = time.monotonic() - started
    proxy.heal()
    tally = ledger.tally(completed(direct, ids))
    stalls = sum(direct.get_status(j).stalls for j in ids[:: max(1, n // 500)])
    report(
        fault=f"7. proxy: +{LATENCY_MS} ms per round trip, {RESET_RATE:.0%} connection resets",
        load=f"{n} jobs of 10 ms, 4 workers × 32",
        lost=tally.lost, duplicated=tally.duplicated,
        recovery=f"{proxy.stats.resets} resets, {retried} enqueue chunks resent, "
        f"stalls in a 1/{max(1, n // 500)} sample: {stalls}; {elapsed:.0f} s in all",
    )  # fmt: skip
    assert proxy.stats.resets > 0
    assert workers.exits == []  # no worker died of the network
    assert tally.enqueued == n
    assert tally.lost == 0
