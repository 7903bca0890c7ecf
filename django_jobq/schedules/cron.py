"""Cron expressions: parsing and the next tick, in a time zone, without a third-party package.

Five fields, ``minute hour day-of-month month day-of-week``, with ``*``, lists, ranges, steps
(``*/5``, ``1-10/2``), month and weekday names (``jan``, ``mon``), 0 or 7 for Sunday, and the
macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.

Day rule (Vixie cron, cronie): when both day fields are restricted a day matches if *either*
matches; a field that starts with ``*`` (``*`` or ``*/2``) counts as unrestricted, and then the
other field alone decides.

Ticks are wall-clock times in the schedule's zone. A wall time that does not exist (the hour
skipped when clocks go forward) fires at the first instant after the gap, once however many
ticks fell in the gap; a wall time that happens twice (clocks go back) fires at its first
occurrence only.

The search skips field by field (month, then day, then hour, then minute), so the cost of a
lookup depends on the shape of the expression, not on how far away the next tick is.
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import functools
from dataclasses import dataclass

__all__ = ["CronExpression", "parse_cron"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {name: i for i, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
)}  # fmt: skip
_DAY_NAMES = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, low, high, names) of each field, in expression order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTH_NAMES),
    ("day-of-week", 0, 7, _DAY_NAMES),
)
# Longest month length, leap years included: a day-of-month beyond it can never match.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# Every (month, day, weekday) combination recurs within one 400-year Gregorian cycle.
_SEARCH_YEARS = 400
_MINUTE = dt.timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A parsed expression; the value sets are sorted tuples (weekdays 0-6, Sunday = 0)."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    dom_star: bool
    dow_star: bool

    def day_matches(self, year: int, month: int, day: int) -> bool:
        dom_ok = day in self.days
        # date.weekday() counts from Monday = 0; cron counts from Sunday = 0.
        dow_ok = (dt.date(year, month, day).weekday() + 1) % 7 in self.weekdays
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def next_wall_time(self, start: dt.datetime) -> dt.datetime:
        """The first naive wall-clock minute at or after ``start`` that matches (no zone
        involved: ``next_after`` maps it to an instant)."""
        if start.second or start.microsecond:
            start = start.replace(second=0, microsecond=0) + _MINUTE
        y, mo, d, h, mi = start.year, start.month, start.day, start.hour, start.minute
        h0, mi0 = self.hours[0], self.minutes[0]
        limit = y + _SEARCH_YEARS
        while y <= limit:
            if mo not in self.months:
                i = bisect.bisect_right(self.months, mo)
                if i == len(self.months):
                    y, mo = y + 1, self.months[0]
                else:
                    mo = self.months[i]
                d, h, mi = 1, h0, mi0
                continue
            if d > calendar.monthrange(y, mo)[1]:
                y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
                d, h, mi = 1, h0, mi0
                continue
            if not self.day_matches(y, mo, d):
                d, h, mi = d + 1, h0, mi0
                continue
            if h not in self.hours:
                i = bisect.bisect_right(self.hours, h)
                if i == len(self.hours):
                    d, h, mi = d + 1, h0, mi0
                else:
                    h, mi = self.hours[i], mi0
                continue
            if mi not in self.minutes:
                i = bisect.bisect_right(self.minutes, mi)
                if i == len(self.minutes):
                    h, mi = h + 1, mi0
                else:
                    mi = self.minutes[i]
                continue
            return dt.datetime(y, mo, d, h, mi)  # noqa: DTZ001 - a wall time, zone applied later
        raise ValueError(
            f"cron {self.expression!r} has no tick in the {_SEARCH_YEARS} years after {start}"
        )

    def next_after(self, after: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
        """The first tick strictly after the instant ``after``, as an aware datetime in ``tz``.

        Candidates are scanned in wall-clock order and kept only when their instant is later
        than ``after``: that is what makes a gap fire once (every candidate inside it maps to
        the same instant) and a repeated hour fire once (its candidates map to their first
        occurrence, which is already past when ``after`` is in the second one)."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("after must be a timezone-aware datetime")
        after_utc = after.astimezone(dt.UTC)
        wall = after_utc.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
        while True:
            candidate = self.next_wall_time(wall)
            instant = wall_to_instant(candidate, tz)
            if instant > after_utc:
                return instant.astimezone(tz)
            wall = candidate + _MINUTE


def wall_to_instant(wall: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """The UTC instant of a naive wall time in ``tz``: its first occurrence when it happens
    twice, the end of the gap when it does not happen at all."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(dt.UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # Inside a gap the two folds map to either side of the transition (PEP 495); the transition
    # is the first whole second whose wall time is past ``wall``.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(dt.UTC)
    lo, hi = sorted((int(first.timestamp()), int(other.timestamp())))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall_at(mid, tz) > wall:
            hi = mid
        else:
            lo = mid
    return dt.datetime.fromtimestamp(hi, dt.UTC)


def _wall_at(epoch: int, tz: dt.tzinfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).astimezone(tz).replace(tzinfo=None)


@functools.lru_cache(maxsize=512)
def parse_cron(expression: str) -> CronExpression:
    """Parse an expression; ``ValueError`` names the field and the value at fault."""
    if not isinstance(expression, str):
        raise ValueError(f"cron expression must be a string, got {expression!r}")
    text = expression.strip()
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise ValueError(f"unknown cron macro {text!r}: use one of {', '.join(sorted(MACROS))}")
        text = macro
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"cron expression {expression!r} has {len(parts)} field(s): expected 5"
            " (minute hour day-of-month month day-of-week) or a macro such as @daily"
        )
    values = [_parse_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = tuple(sorted({v % 7 for v in values[4]}))
    cron = CronExpression(
        expression=expression,
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        dom_star=parts[2].startswith("*"),
        dow_star=parts[4].startswith("*"),
    )
    if cron.dom_star or cron.dow_star:
        # Only the day-of-month can make the expression impossible (any date falls on every
        # weekday over the years): 31 in April, 30 in February.
        if not any(d <= _MAX_DAYS[m] for m in cron.months for d in cron.days):
            raise ValueError(
                f"cron expression {expression!r} never fires: day-of-month {parts[2]!r} does"
                f" not occur in month {parts[3]!r}"
            )
    return cron


def _parse_field(
    text: str, name: str, low: int, high: int, names: dict[str, int]
) -> tuple[int, ...]:
    selected: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ValueError(f"cron {name} field {text!r}: empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _is_number(step_text) or int(step_text) == 0:
                raise ValueError(
                    f"cron {name} field {text!r}: step {step_text!r} must be a positive integer"
                )
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _value(first, text, name, low, high, names)
            end = _value(last, text, name, low, high, names)
            if name == "day-of-week" and end == 0 and start > 0:
                end = 7  # "mon-sun", "5-0": Sunday closes the week as well as opening it
            if start > end:
                raise ValueError(
                    f"cron {name} field {text!r}: range {base!r} goes backwards"
                    f" ({low}-{high} has no wrap-around)"
                )
        else:
            start = end = _value(base, text, name, low, high, names)
            if slash:
                # Vixie cron refuses "5/10" too; say what was probably meant.
                raise ValueError(
                    f"cron {name} field {text!r}: a step needs a range or *, e.g."
                    f" {base}-{high}/{step}"
                )
        selected.update(range(start, end + 1, step))
    return tuple(sorted(selected))


def _value(token: str, text: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    key = token.lower()
    if key in names:
        return names[key]
    if not _is_number(token):
        hint = f" or a name ({', '.join(names)})" if names else ""
        raise ValueError(f"cron {name} field {text!r}: {token!r} is not a number{hint}")
    value = int(token)
    if not low <= value <= high:
        raise ValueError(f"cron {name} field {text!r}: {value} is out of range {low}-{high}")
    return value


def _is_number(text: str) -> bool:
    # str.isdigit() accepts "²" and other digits int() refuses.
    return text.isascii() and text.isdigit()
