"""Charts drawn on the server as inline SVG: no JavaScript library, no CDN (admin machines
often have no internet), and colours from CSS classes so dark mode restyles them.

Two figures per queue and window: throughput (completed and failed jobs per minute, stacked
bars) and wait / run-time percentiles (p50 and p95 lines). Data comes from the per-minute rows
of ``django_jobq.rollup`` (folded from the jobs finished since the last view), never from a
scan of the jobs table.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..mirror import rollup

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 14, 28


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    step: dt.timedelta
    buckets: int

    @property
    def span(self) -> dt.timedelta:
        return self.step * self.buckets

    def start(self, now: dt.datetime) -> dt.datetime:
        """The first bucket's start: buckets are aligned to whole minutes / hours (UTC), so
        that each holds whole minute rows."""
        unit = int(self.step.total_seconds())
        epoch = int(now.timestamp()) // unit * unit
        return dt.datetime.fromtimestamp(epoch, tz=dt.UTC) - self.step * (self.buckets - 1)


WINDOWS = (
    Window("hour", "last hour", dt.timedelta(minutes=1), 60),
    Window("day", "last 24 hours", dt.timedelta(hours=1), 24),
)


@dataclass
class Series:
    name: str
    css: str
    values: list[float | None]


def bucket_of(when: dt.datetime, start: dt.datetime, window: Window) -> int | None:
    index = int((when - start) / window.step)
    return index if 0 <= index < window.buckets else None


def _buckets(
    alias: str, queue: str, window: Window, now: dt.datetime, rows: list | None = None
) -> list[list[Any]]:
    """The window's minute rows grouped into its buckets (one per minute or hour); ``rows``:
    minute rows already read (from the window's start or earlier), to read them only once
    per page."""
    start = window.start(now)
    out: list[list[Any]] = [[] for _ in range(window.buckets)]
    for row in rollup.minutes(alias, queue, start) if rows is None else rows:
        index = bucket_of(row.minute, start, window)
        if index is not None:
            out[index].append(row)
    return out


def throughput(
    alias: str, queue: str, window: Window, now: dt.datetime, rows: list | None = None
) -> list[Series]:
    """Completed and failed jobs per minute in each bucket of the window."""
    buckets = _buckets(alias, queue, window, now, rows)
    per_minute = window.step.total_seconds() / 60
    return [
        Series("completed", "ok", [sum(r.completed for r in b) / per_minute for b in buckets]),
        Series("failed", "bad", [sum(r.failed for r in b) / per_minute for b in buckets]),
    ]


def percentiles(
    alias: str, queue: str, window: Window, now: dt.datetime, rows: list | None = None
) -> list[Series]:
    """p50 / p95 of wait time (due → started) and run time (started → finished), seconds,
    from the minute rows' histograms (within 9% of the exact figure, see rollup.py)."""
    waits: list[dict[int, int]] = []
    runs: list[dict[int, int]] = []
    for bucket in _buckets(alias, queue, window, now, rows):
        wait: dict[int, int] = {}
        run: dict[int, int] = {}
        for row in bucket:
            rollup.merge(wait, row.waits)
            rollup.merge(run, row.runs)
        waits.append(wait)
        runs.append(run)

    def seconds(histograms: list[dict[int, int]], q: float) -> list[float | None]:
        values = [rollup.quantile(h, q) for h in histograms]
        return [None if v is None else v / 1000 for v in values]

    return [
        Series("wait p50", "wait", seconds(waits, 0.5)),
        Series("wait p95", "wait95", seconds(waits, 0.95)),
        Series("run p50", "run", seconds(runs, 0.5)),
        Series("run p95", "run95", seconds(runs, 0.95)),
    ]


# -- drawing ------------------------------------------------------------------------------


def _scale(top: float) -> tuple[float, list[float]]:
    """A round upper bound and 4 gridlines, so axes read 0 / 5 / 10 rather than 0 / 4.37."""
    if top <= 0:
        return 1.0, [0.25, 0.5, 0.75, 1.0]
    magnitude = 10 ** math.floor(math.log10(top))
    for step in (1, 2, 2.5, 5, 10):
        bound = step * magnitude
        if bound >= top:
            break
    return bound, [bound * i / 4 for i in range(1, 5)]


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _n(value: float) -> str:
    """A coordinate with one decimal (format_html escapes its arguments into strings)."""
    return f"{value:.1f}"


def _frame(title: str, unit: str, bound: float, grid: list[float], labels: Sequence[str]) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [format_html("<title>{}</title>", title)]
    for value in [0.0, *grid]:
        y = TOP + plot_h - value / bound * plot_h
        parts.append(format_html(
            '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
            LEFT, WIDTH - RIGHT, _n(y), _n(y), LEFT - 6, _n(y + 4), _fmt(value),
        ))  # fmt: skip
    parts.append(format_html(
        '<text class="axis" x="4" y="{}" transform="rotate(-90 10 {})">{}</text>',
        TOP + plot_h // 2, TOP + plot_h // 2, unit,
    ))  # fmt: skip
    for i, label in enumerate(labels):
        x = LEFT + plot_w * i / max(1, len(labels) - 1)
        anchor = "start" if i == 0 else "end" if i == len(labels) - 1 else "middle"
        parts.append(format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="{}">{}</text>',
            _n(x), HEIGHT - 8, anchor, label,
        ))  # fmt: skip
    return "".join(parts)


def _svg(title: str, body: str, legend: list[Series]) -> SafeString:
    keys = format_html_join(
        "", '<span class="jobq-key jobq-key-{}">{}</span>', ((s.css, s.name) for s in legend)
    )
    return format_html(
        '<figure class="jobq-chart"><figcaption>{} <span class="jobq-legend">{}</span>'
        '</figcaption><svg viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'preserveAspectRatio="xMidYMid meet">{}</svg></figure>',
        title, keys, WIDTH, HEIGHT, title, mark_safe(body),  # noqa: S308 - built with format_html
    )  # fmt: skip


def _empty(title: str, legend: list[Series], what: str) -> SafeString:
    """A window with nothing to draw says so, rather than showing blank axes."""
    body = format_html(
        '<text class="empty" x="{}" y="{}" text-anchor="middle">{}</text>',
        WIDTH // 2, HEIGHT // 2, what,
    )  # fmt: skip
    return _svg(title, body, legend)


def bar_chart(title: str, unit: str, stacked: list[Series], labels: Sequence[str]) -> SafeString:
    buckets = len(stacked[0].values)
    totals = [sum(s.values[i] or 0 for s in stacked) for i in range(buckets)]
    if not any(totals):
        return _empty(title, stacked, "No job finished in this window")
    bound, grid = _scale(max(totals, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / buckets
    parts = [_frame(title, unit, bound, grid, labels)]
    for i in range(buckets):
        base = 0.0
        for series in stacked:
            value = series.values[i] or 0
            if value <= 0:
                continue
            height = value / bound * plot_h
            y = TOP + plot_h - (base + value) / bound * plot_h
            parts.append(format_html(
                '<rect class="bar {}" x="{}" y="{}" width="{}" height="{}">'
                "<title>{}: {}/min</title></rect>",
                series.css, _n(LEFT + i * slot + 1), _n(y), _n(max(1.0, slot - 2)), _n(height),
                series.name, _fmt(value),
            ))  # fmt: skip
            base += value
    return _svg(title, "".join(parts), stacked)


#: Durations drawn in the unit their range reads best in: (below this many seconds, unit,
#: factor from seconds).
TIME_UNITS = ((1.0, "ms", 1000.0), (120.0, "seconds", 1.0), (math.inf, "minutes", 1 / 60))


def line_chart(title: str, unit: str, lines: list[Series], labels: Sequence[str]) -> SafeString:
    """Lines through the buckets that have a value; a bucket without one (no job finished
    then) breaks the line, so a gap shows as a gap rather than a slope across it. Values in
    seconds are drawn in ms, seconds or minutes, as their range reads best."""
    top = max((v for s in lines for v in s.values if v is not None), default=None)
    if top is None:
        return _empty(title, lines, "No job finished in this window")
    factor = 1.0
    if unit == "seconds":
        _, unit, factor = next(u for u in TIME_UNITS if top < u[0])
    bound, grid = _scale(top * factor)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [_frame(title, unit, bound, grid, labels)]
    for series in lines:
        count = len(series.values)
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(series.values):
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((LEFT + plot_w * (i + 0.5) / count,
                             TOP + plot_h - v * factor / bound * plot_h))  # fmt: skip
        for run in runs:
            if len(run) > 1:
                coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                parts.append(
                    format_html('<polyline class="line {}" points="{}"/>', series.css, coords)
                )
        dot = '<circle class="dot {}" cx="{}" cy="{}" r="2.5"/>'
        parts.extend(format_html(dot, series.css, _n(x), _n(y)) for run in runs for x, y in run)
    return _svg(title, "".join(parts), lines)


def labels_for(window: Window, now: dt.datetime) -> list[str]:
    start = timezone.localtime(window.start(now))
    end = timezone.localtime(now)
    middle = timezone.localtime(window.start(now) + window.span / 2)
    return [f"{start:%H:%M}", f"{middle:%H:%M}", f"{end:%H:%M}"]


def queue_charts(alias: str, queue: str, now: dt.datetime | None = None) -> list[dict]:
    """Both figures for each window, ready for the template."""
    now = now or timezone.now()
    # The day's minute rows cover the hour too: read (and decode) them once, not four times.
    rows = rollup.minutes(alias, queue, min(window.start(now) for window in WINDOWS))
    out = []
    for window in WINDOWS:
        labels = labels_for(window, now)
        out.append({
            "window": window,
            "throughput": bar_chart(
                f"Throughput, {window.label}", "jobs/min",
                throughput(alias, queue, window, now, rows), labels,
            ),
            "latency": line_chart(
                f"Wait and run time, {window.label}", "seconds",
                percentiles(alias, queue, window, now, rows), labels,
            ),
        })  # fmt: skip
    return out


HISTORY_DAYS = 30


def history_charts(alias: str, queue: str, now: dt.datetime | None = None) -> dict | None:
    """The last ``HISTORY_DAYS`` days from the Spark analytics (``QueueMetric``, period day),
    or None when ``manage.py jobq_analytics`` has not written any for this queue. Reading the
    precomputed rows keeps this page cheap however large the event history is."""
    from ..models import QueueMetric

    now = now or timezone.now()
    first = dt.datetime.combine(
        (now - dt.timedelta(days=HISTORY_DAYS - 1)).date(), dt.time(), tzinfo=dt.UTC
    )
    rows = list(
        QueueMetric.objects.using(alias)
        .filter(queue=queue, period=QueueMetric.Period.DAY, bucket__gte=first)
        .order_by("bucket", "-completed")
    )
    if not rows:
        return None
    per_day: dict[int, list[QueueMetric]] = {}
    for row in rows:  # one row per handler and day; a queue has had one handler at a time
        index = (row.bucket - first).days
        if 0 <= index < HISTORY_DAYS:
            per_day.setdefault(index, []).append(row)

    def total(name: str) -> list[float | None]:
        return [
            sum(getattr(r, name) for r in per_day[i]) / 1440 if i in per_day else None
            for i in range(HISTORY_DAYS)
        ]

    def busiest(name: str) -> list[float | None]:  # the day's main handler, in seconds
        values: list[float | None] = []
        for i in range(HISTORY_DAYS):
            value = getattr(per_day[i][0], name) if i in per_day else None
            values.append(None if value is None else value / 1000)
        return values

    labels = [f"{first:%d %b}", f"{first + dt.timedelta(days=HISTORY_DAYS // 2):%d %b}",
              f"{now:%d %b}"]  # fmt: skip
    computed = max(r.computed_at for r in rows)
    return {
        "label": f"last {HISTORY_DAYS} days (Spark analytics)",
        "computed_at": computed,
        "throughput": bar_chart(
            f"Throughput by day, last {HISTORY_DAYS} days", "jobs/min",
            [Series("completed", "ok", total("completed")),
             Series("failed", "bad", total("failed"))], labels,
        ),
        "latency": line_chart(
            f"Wait and run time by day, last {HISTORY_DAYS} days", "seconds",
            [Series("wait p95", "wait95", busiest("wait_p95")),
             Series("run p50", "run", busiest("run_p50")),
             Series("run p95", "run95", busiest("run_p95"))], labels,
        ),
    }  # fmt: skip
