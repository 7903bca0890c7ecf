"""The peer table as a PNG: one panel per workload, one bar per system, django_jobq highlighted.

    bench/peers/.venv/chart/bin/python -m bench.peers.chart bench/peers/results.json OUT.png

Runs in the chart's own venv (matplotlib is not a project dependency); the orchestrator calls it.
Each bar is labelled with its figure and, for a peer, django_jobq's advantage over it (×N:
django_jobq N times better, the same ratio as the table); a workload a peer cannot do shows "n/a".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.peers import report  # noqa: E402

OURS = "#1f6f43"
PEER = "#8a99a8"


def render(result: dict, out: Path) -> None:
    summary = result["summary"]
    rel = result["ratios"]
    systems = report.systems_in_order(summary)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))
    for ax, (metric, _, _, unit, higher, label) in zip(axes.flat, report.METRICS, strict=True):
        values = [summary[s].get(metric, {}).get("value") for s in systems]
        top = max((v for v in values if v is not None), default=1) or 1
        y = list(range(len(systems)))[::-1]
        for pos, system, value in zip(y, systems, values, strict=True):
            if value is None:
                ax.text(0, pos, "  n/a", va="center", fontsize=9, color="#555")
                continue
            ax.barh(pos, value, color=OURS if system == report.REFERENCE else PEER)
            text = report.fmt(value, unit)
            factor = rel.get(system, {}).get(metric)
            if factor is not None:
                text += f"  (×{factor:g})"
            ax.text(value + top * 0.02, pos, text, va="center", fontsize=9)
        ax.set_yticks(y, systems)
        ax.set_xlim(0, top * 1.6)
        better = "higher is better" if higher else "lower is better"
        ax.set_title(f"{label}\n({unit}, {better})", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    m = result["machine"]
    rounds = f"median of {result['rounds']} interleaved round(s)"
    loads = result.get("load_average_before_rounds") or [0]
    busy = f"load average {min(loads):.1f}-{max(loads):.1f} from other work"
    fig.suptitle(
        f"django_jobq vs Python job queues on one local Redis — {result['date'][:10]}, "
        f"{m['cores']} cores ({busy}), Redis {m['redis_server']}, {rounds}\n"
        "×N after a peer's figure: django_jobq is N times better on that figure",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main() -> None:
    result = json.loads(Path(sys.argv[1]).read_text())
    render(result, Path(sys.argv[2]))


if __name__ == "__main__":
    main()
