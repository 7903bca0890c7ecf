"""The queue page's SVG charts (django_jobq/admin/charts.py): gaps drawn as gaps, durations in
the unit their range reads best in, and an empty window said in words instead of blank axes."""

from __future__ import annotations

import re

from django_jobq.admin.charts import Series, bar_chart, line_chart

LABELS = ["12:00", "12:30", "13:00"]


def polylines(svg: str) -> list[str]:
    return re.findall(r'<polyline class="line run" points="([^"]+)"', svg)


def test_a_bucket_without_a_value_breaks_the_line():
    svg = str(line_chart("t", "seconds", [Series("run p50", "run", [1, 2, None, 3, 4])], LABELS))
    assert len(polylines(svg)) == 2  # one line across the gap made it look like a slope
    assert svg.count('<circle class="dot run"') == 4


def test_durations_are_drawn_in_ms_seconds_or_minutes_by_their_range():
    def unit(values: list[float]) -> str:
        svg = str(line_chart("t", "seconds", [Series("run", "run", values)], LABELS))
        return re.search(r'transform="rotate\(-90[^"]*">([^<]+)</text>', svg).group(1)

    assert unit([0.004, 0.05]) == "ms"
    assert unit([0.5, 3.0]) == "seconds"
    assert unit([30.0, 900.0]) == "minutes"
    svg = str(line_chart("t", "seconds", [Series("run", "run", [0.004, 0.05])], LABELS))
    assert ">50</text>" in svg  # the top gridline reads 50 (ms), not 0.05


def test_an_empty_window_says_so_instead_of_blank_axes():
    for svg in (
        str(line_chart("t", "seconds", [Series("run", "run", [None, None])], LABELS)),
        str(bar_chart("t", "jobs/min", [Series("completed", "ok", [0, 0, 0])], LABELS)),
    ):
        assert "No job finished in this window" in svg
        assert 'class="grid"' not in svg and 'class="axis"' not in svg
    drawn = str(bar_chart("t", "jobs/min", [Series("completed", "ok", [0, 2, 0])], LABELS))
    assert 'class="grid"' in drawn and "No job finished" not in drawn
