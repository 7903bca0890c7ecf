"""Number formatting for the admin's tables: thousands separators on every count ("24,388"
reads at a glance, "24388" does not), and rates with their
unit. Plain filters rather than ``django.contrib.humanize``, which a project may not install."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def count(value: Any) -> str:
    """``12345`` → ``12,345``; None → an em dash (unknown, e.g. the storage unreachable)."""
    if value is None or value == "":
        return "—"
    try:
        number = int(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:,}"


@register.filter
def per_minute(value: Any) -> str:
    """Jobs per minute with its unit, one decimal below 10 ("0.4/min", "1,250/min")."""
    if value is None:
        return "—"
    rate = float(value)
    return f"{rate:,.1f}/min" if rate < 10 else f"{rate:,.0f}/min"
