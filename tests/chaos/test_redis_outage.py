"""Fault 6: Redis unreachable for 10 s behind a loopback proxy that blackholes traffic."""

from __future__ import annotations

import threading
import time

import pytest
from rest_framework.test import APIClient

from django_jobq.api.keys import create_key
from django_jobq.backend import reset_storage
from django_jobq.errors import StorageUnavailable, Timeout

from ..helpers import wait_until

OUTAGE = 10.0
WAIT_DEADLINE = 3.0


class Producer(threading.Thread):
    """Enqueues a job every 20 ms; an accepted one goes into the ledger, a refused one is sent
    again after the outage (same id: deduplicated if it had been stored after all)."""

    def __init__(self, queue, ledger) -> None:
        super().__init__(daemon=True)
        self.queue, self.ledger = queue, ledger
        self.stop = threading.Event()
        self.refused: list[str] = []
        self.errors = 0
        self.n = 0

    def send(self, job_id: str) -> bool:
        try:
            result = self.queue.enqueue(job_id, {"seconds": 0.01}, max_stalls=20)
        except StorageUnavailable:
            self.errors += 1
            return False
        self.ledger.record_enqueued([result.job_id])
        return True

    def run(self) -> None:
        while not self.stop.wait(0.02):
            job_id = f"out-{self.n}"
            self.n += 1
            if not self.send(job_id):
                self.refused.append(job_id)


def timed(call):
    start = time.monotonic()
    try:
        outcome = call()
    except Exception as exc:  # the outcome is what the test inspects
        outcome = exc
    return outcome, time.monotonic() - start


@pytest.mark.django_db(transaction=True)
def test_redis_blackholed_for_ten_seconds(
    private_redis, fault_proxy, supervise, ledger, queue_of, prefix, settings, report
):
    server = private_redis()
    proxy = fault_proxy(server.port)
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": proxy.url, "PREFIX": prefix}
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Api-Key " + create_key(
        "chaos", queues=["*"], actions=["enqueue", "read"])[1])  # fmt: skip
    workers = supervise(["runworker", "chaos-ledger", "-c", "4", "--lease", "3000"], 2,
                        redis_url=proxy.url)  # fmt: skip
    supervise(["runreaper", "--interval", "0.5"], 1, redis_url=proxy.url)
    producer = Producer(queue_of("chaos-ledger", proxy.url), ledger)
    waiter_queue = queue_of("chaos-ledger", proxy.url)
    direct = queue_of("chaos-ledger", server.url)
    producer.start()
    assert wait_until(lambda: len(ledger.runs_per_job()) > 20, 30), "workers never ran"
    pids = workers.pids()
    assert api.get("/jobq/queues/chaos-ledger/jobs/out-0/").status_code == 200
    assert waiter_queue.enqueue_and_wait("warm", {"seconds": 0}, timeout=30) == "warm"
    time.sleep(1)
    baseline = server.connected_clients()

    waits: list[tuple[object, float]] = []

    def waiter(i: int) -> None:
        waits.append(timed(lambda: waiter_queue.enqueue_and_wait(
            f"wait-{i}", {"seconds": 0.5}, timeout=WAIT_DEADLINE)))  # fmt: skip

    threads = [threading.Thread(target=waiter, args=(0,))]
    threads[0].start()
    time.sleep(0.3)  # that one is waiting for its result when the network goes
    proxy.blackhole()
    cut = time.monotonic()
    probes: list[tuple[int, float]] = []
    i = 1
    while time.monotonic() - cut < OUTAGE - 2.2:
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        i += 1
        body = {"id": f"api-{i}"}
        for call in (
            lambda body=body: api.post("/jobq/queues/chaos-ledger/jobs/", body, format="json"),
            lambda: api.get("/jobq/queues/chaos-ledger/jobs/out-0/"),
            lambda: api.get("/jobq/queues/chaos-ledger/jobs/out-0/result/?wait=5"),
        ):
            response, elapsed = timed(call)
            probes.append((getattr(response, "status_code", 0), elapsed))
    time.sleep(max(0.0, cut + OUTAGE - time.monotonic()))
    proxy.heal()
    healed = time.time()
    for thread in threads:
        thread.join(15)

    # Processing resumes: the first run to start after the heal.
    assert wait_until(lambda: ledger.query(
        "SELECT count(*) FROM executions WHERE started > %s", (healed,))[0][0] > 0)  # fmt: skip
    (resumed,) = ledger.query("SELECT min(started) FROM executions WHERE started > %s",
                              (healed,))[0]  # fmt: skip
    producer.stop.set()
    producer.join(10)
    for job_id in producer.refused:
        assert producer.send(job_id)
    ids = [row[0] for row in ledger.query("SELECT job_id FROM enqueued")]
    assert wait_until(lambda: set(ids) <= set(dict(ledger.query(
        "SELECT job_id, runs FROM effects"))), 60)  # fmt: skip
    tally = ledger.tally([j for j in ids if direct.get_status(j).state.value == "completed"])
    back_to_baseline = wait_until(lambda: server.connected_clients() <= baseline, 30, 0.2)
    after = server.connected_clients()

    statuses = sorted({status for status, _ in probes})
    wait_outcomes = sorted({type(outcome).__name__ for outcome, _ in waits})
    report(
        fault="6. Redis blackholed 10 s (loopback proxy)",
        load=f"{tally.enqueued} jobs at 50/s, 2 workers × 4, API probes, enqueue_and_wait callers",
        lost=tally.lost, duplicated=tally.duplicated,
        recovery=f"first job started {resumed - healed:.2f} s after recovery; API answered "
        f"{statuses} in ≤ {max(e for _, e in probes):.2f} s; enqueue_and_wait: {wait_outcomes}"
        f" in ≤ {max(e for _, e in waits):.2f} s (deadline {WAIT_DEADLINE:g} s); connections "
        f"{baseline} before, {after} after",
    )  # fmt: skip
    # Never a 500, never a hang: a call without a timeout would last until the network heals,
    # OUTAGE seconds later. How fast the answers and the resumption came is the report's.
    assert statuses == [503]
    assert max(elapsed for _, elapsed in probes) < OUTAGE / 2
    assert len(waits) == len(threads)
    for outcome, elapsed in waits:
        assert isinstance(outcome, (str, Timeout, StorageUnavailable)), outcome
        assert elapsed < OUTAGE, elapsed  # its deadline held: it did not wait for the heal
    assert workers.exits == [] and workers.pids() == pids  # no worker crashed
    assert tally.lost == 0
    assert back_to_baseline, f"{after} connections after the outage, {baseline} before"
    reset_storage()
