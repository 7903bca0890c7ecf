"""URL converters of queue names and job ids in API paths.

They accept any path segment: a malformed name is then refused by the view (``JobQView``
checks it against the core's rules) with the API's JSON 404 body. Refused here, by the URL
resolver, it became Django's HTML 404 page, which an API client cannot parse."""

from __future__ import annotations


class QueueNameConverter:
    regex = r"[^/]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class JobIdConverter(QueueNameConverter):
    pass
