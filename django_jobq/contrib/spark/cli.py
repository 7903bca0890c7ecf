"""Option parsing shared by ``jobq_export`` and ``jobq_analytics`` (edges stay thin)."""

from __future__ import annotations

import datetime as dt
import re

_RELATIVE = re.compile(r"(\d+)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """``2026-03-01``, ``2026-03-01T12:00[+02:00]`` (naive means UTC) or ``90m`` / ``6h`` /
    ``7d`` before now; anything else is refused with the accepted forms named."""
    text = value.strip()
    match = _RELATIVE.fullmatch(text)
    if match:
        delta = dt.timedelta(**{_UNITS[match[2]]: int(match[1])})
        return (now or dt.datetime.now(dt.UTC)) - delta
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since {value!r}: give an ISO date or datetime (2026-03-01, 2026-03-01T12:00Z) "
            "or an age such as 90m, 6h, 7d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
