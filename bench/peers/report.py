"""Medians, ratios and the table of the peer comparison, from the per-workload JSON records.

Pure functions of the records (no Redis, no peers), so they are tested with a fixed input
(``tests/bench/test_peers_report.py``) and shared by the orchestrator and the chart.

Ratio: how many times better django_jobq is than the peer on a figure, oriented so that above
1 always means django_jobq is better: django_jobq ÷ peer for throughput, peer ÷ django_jobq for
latency. A figure a peer cannot produce stays ``None`` with its reason and gets no ratio.
"""

from __future__ import annotations

import statistics
from typing import Any

REFERENCE = "django_jobq"
# (metric, record workload, record field, unit, higher is better, label)
METRICS: list[tuple[str, str, str, str, bool, str]] = [
    ("enqueue_one", "enqueue_one", "value", "jobs/s", True, "enqueue, one call per job"),
    ("enqueue_bulk", "enqueue_bulk", "value", "jobs/s", True, "enqueue, bulk"),
    ("drain_1", "drain_1", "value", "jobs/s", True, "drain, 1 worker process"),
    ("drain_4", "drain_4", "value", "jobs/s", True, "drain, 4 worker processes"),
    (
        "drain_1_steady",
        "drain_1",
        "steady_per_s",
        "jobs/s",
        True,
        "drain, 1 process, steady (first to last completion)",
    ),
    (
        "drain_4_steady",
        "drain_4",
        "steady_per_s",
        "jobs/s",
        True,
        "drain, 4 processes, steady (first to last completion)",
    ),
    ("rr_p50", "rr", "p50_ms", "ms", False, "request/response p50"),
    ("rr_p99", "rr", "p99_ms", "ms", False, "request/response p99"),
]


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """system -> metric -> {"value": median over rounds, "values": [...], "na"/"errors"}.

    A failed round (``error``) is left out of the median and listed; a peer that cannot do a
    workload (``na``) gets no value at all, whatever the rounds.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for metric, workload, field, unit, _, _ in METRICS:
        for record in records:
            if record.get("workload") != workload:
                continue
            cell = out.setdefault(record["system"], {}).setdefault(
                metric, {"values": [], "unit": unit}
            )
            if record.get("na"):
                cell["na"] = record["na"]
            elif record.get("error"):
                cell.setdefault("errors", []).append(record["error"])
            elif record.get(field) is not None:
                cell["values"].append(record[field])
    for metrics in out.values():
        for cell in metrics.values():
            values = cell["values"]
            cell["value"] = None if cell.get("na") or not values else statistics.median(values)
    return out


def advantage(ours: float | None, theirs: float | None, higher_is_better: bool) -> float | None:
    """How many times better django_jobq is (above 1: better); None if either is missing."""
    if not ours or not theirs:
        return None
    return round(ours / theirs if higher_is_better else theirs / ours, 2)


def ratios(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """peer -> metric -> django_jobq's advantage over that peer."""
    ours = summary.get(REFERENCE, {})
    out: dict[str, dict[str, float | None]] = {}
    for system, metrics in summary.items():
        if system == REFERENCE:
            continue
        out[system] = {
            metric: advantage(
                ours.get(metric, {}).get("value"), metrics.get(metric, {}).get("value"), higher
            )
            for metric, _, _, _, higher, _ in METRICS
        }
    return out


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:.2f} ms"
    return f"{value:,.0f}/s"


def systems_in_order(summary: dict[str, Any]) -> list[str]:
    """django_jobq first, then the peers alphabetically (case-insensitive)."""
    peers = sorted((s for s in summary if s != REFERENCE), key=str.lower)
    return ([REFERENCE] if REFERENCE in summary else []) + peers


def table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown: one row per workload, one column per system; a peer's cell carries
    django_jobq's advantage over it (``×N``: django_jobq N times better; below 1: worse)."""
    systems = systems_in_order(summary)
    rel = ratios(summary)
    lines = [
        "| workload | " + " | ".join(systems) + " |",
        "|---|" + "---|" * len(systems),
    ]
    for metric, _, _, unit, _, label in METRICS:
        cells = []
        for system in systems:
            cell = summary[system].get(metric, {})
            text = fmt(cell.get("value"), unit)
            if system != REFERENCE:
                factor = rel[system][metric]
                if factor is not None:
                    text += f" (×{factor:g})"
            elif text != "n/a":
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def not_available(summary: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per n/a cell: which system, which workload, why."""
    out = []
    for system in systems_in_order(summary):
        for metric, _, _, _, _, label in METRICS:
            reason = summary[system].get(metric, {}).get("na")
            if reason:
                out.append(f"{system}, {label}: {reason}")
    return out
