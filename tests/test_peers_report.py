"""The peer benchmark's table and ratios (bench/peers/report.py), from fixed records.

Only the arithmetic and the table: nothing here installs or runs a peer, so it belongs in the
default run. The peers themselves are exercised by ``python -m bench.peers --quick``.
"""

from bench.peers import report


def rec(system: str, workload: str, **fields: object) -> dict:
    return {"system": system, "workload": workload, **fields}


RECORDS = [
    # django_jobq: three rounds of everything
    *(rec("django_jobq", "enqueue_one", value=v) for v in (5000, 4000, 6000)),
    *(rec("django_jobq", "enqueue_bulk", value=v) for v in (60000, 50000, 40000)),
    *(rec("django_jobq", "drain_1", value=v) for v in (10000, 12000, 11000)),
    *(rec("django_jobq", "drain_4", value=v) for v in (8000, 8000, 8000)),
    *(rec("django_jobq", "rr", value=0.8, p50_ms=0.8, p99_ms=1.0) for _ in range(3)),
    # a peer without bulk enqueue, one failed drain round
    *(rec("Peer", "enqueue_one", value=v) for v in (2500, 2000, 3000)),
    *(rec("Peer", "enqueue_bulk", value=None, na="no bulk call") for _ in range(3)),
    rec("Peer", "drain_1", value=2200),
    rec("Peer", "drain_1", value=None, error="worker exited 1"),
    rec("Peer", "drain_1", value=2000),
    *(rec("Peer", "drain_4", value=16000) for _ in range(3)),
    *(rec("Peer", "rr", value=2.0, p50_ms=2.0, p99_ms=5.0) for _ in range(3)),
]


def test_medians_skip_failed_rounds_and_keep_the_errors():
    summary = report.summarise(RECORDS)
    assert summary["django_jobq"]["enqueue_one"]["value"] == 5000
    assert summary["django_jobq"]["enqueue_bulk"]["value"] == 50000
    drain = summary["Peer"]["drain_1"]
    assert drain["value"] == 2100  # median of the two rounds that produced a figure
    assert drain["errors"] == ["worker exited 1"]
    assert summary["Peer"]["rr_p50"]["value"] == 2.0
    assert summary["Peer"]["rr_p99"]["value"] == 5.0


def test_a_workload_a_peer_cannot_do_has_no_value_and_no_ratio():
    summary = report.summarise(RECORDS)
    assert summary["Peer"]["enqueue_bulk"]["value"] is None
    assert summary["Peer"]["enqueue_bulk"]["na"] == "no bulk call"
    assert report.ratios(summary)["Peer"]["enqueue_bulk"] is None
    assert report.not_available(summary) == ["Peer, enqueue, bulk: no bulk call"]


def test_ratios_read_above_one_as_django_jobq_better_for_throughput_and_latency():
    rel = report.ratios(report.summarise(RECORDS))["Peer"]
    assert rel["enqueue_one"] == 2.0  # 5,000/s against 2,500/s
    assert rel["drain_1"] == round(11000 / 2100, 2)
    assert rel["drain_4"] == 0.5  # the peer is twice as fast here: below 1
    assert rel["rr_p50"] == 2.5  # 2.0 ms against 0.8 ms
    assert rel["rr_p99"] == 5.0


def test_table_has_a_row_per_workload_and_ratios_in_the_peer_cells():
    text = report.table(report.summarise(RECORDS))
    lines = text.splitlines()
    assert lines[0] == "| workload | django_jobq | Peer |"
    assert len(lines) == 2 + len(report.METRICS)
    assert "| enqueue, one call per job | **5,000/s** | 2,500/s (×2) |" in lines
    assert "| enqueue, bulk | **50,000/s** | n/a |" in lines
    assert "| drain, 4 worker processes | **8,000/s** | 16,000/s (×0.5) |" in lines
    assert "| request/response p50 | **0.80 ms** | 2.00 ms (×2.5) |" in lines


def test_advantage_is_none_when_either_side_is_missing():
    assert report.advantage(None, 5.0, True) is None
    assert report.advantage(5.0, None, False) is None
    assert report.advantage(0.0, 5.0, True) is None
