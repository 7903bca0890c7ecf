"""URL converters matching the core's name rules, so a malformed queue name or job id in a
path is an unknown resource (404) before any view runs."""

from __future__ import annotations


class QueueNameConverter:
    regex = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class JobIdConverter(QueueNameConverter):
    regex = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
