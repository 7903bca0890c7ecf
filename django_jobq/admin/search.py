"""The job list's search in payloads and errors ("search in: payload / error").

Both are substring searches of a bounded text made from the column: the first
``PAYLOAD_BYTES`` bytes of the payload (JSON or msgpack: its strings are readable bytes either
way), and the error's type, message and traceback, cut to ``ERROR_CHARS``. On PostgreSQL with
``pg_trgm`` (migration 0029) a trigram GIN index on exactly that expression serves
``ILIKE '%term%'`` over every row. Elsewhere, when the extension could not be created, or for
a term without three letters or digits in a row, the newest ``SCAN_ROWS`` jobs of the list
are scanned and the page says so: a search that reads a million payloads would take seconds.

The texts are expressions over the stored columns, so nothing new is written by the storage
backends or the mirror; the indexes are the only cost an enqueue pays for this.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from django.db import connections
from django.db.models import BooleanField, F, Func, QuerySet, TextField
from django.db.models.functions import Substr

#: The query-string parameter of the "search in" choice, and its choices.
SEARCH_IN_VAR = "in"
SEARCH_IN = {"": "id or handler", "payload": "payload", "error": "error"}
#: Longer terms are cut: no job id, handler or useful fragment of a payload is longer.
MAX_TERM = 200
#: The searched part of each payload (bytes) and of each error (characters): the indexes are
#: built on exactly these bounds (migration 0029), so they stay small and fast to write.
PAYLOAD_BYTES = 500
ERROR_CHARS = 1000
#: Without the trigram index, how many of the newest jobs of the list are searched.
SCAN_ROWS = 20_000
#: pg_trgm takes its trigrams from runs of letters and digits: a term without three in a row
#: gives the index nothing to look up, and it would read every entry.
TRIGRAM_WORD = re.compile(r"[^\W_]{3}")
PAYLOAD_INDEX = "jobq_job_payload_trgm"
ERROR_INDEX = "jobq_job_error_trgm"

_indexes_present: dict[tuple[str, str], tuple[bool, float]] = {}


def clean_term(raw: str) -> tuple[str, list[str]]:
    """The term as searched, and what was changed about it: NUL characters (PostgreSQL text
    cannot hold them) and characters that are not valid Unicode are dropped, and a term is
    cut at ``MAX_TERM`` characters."""
    notes = []
    term = raw.strip()
    cleaned = term.encode("utf-8", "ignore").decode("utf-8").replace("\x00", "")
    if cleaned != term:
        notes.append("NUL and invalid characters were left out of the search.")
    if len(cleaned) > MAX_TERM:
        cleaned = cleaned[:MAX_TERM]
        notes.append(f"The search term was cut to its first {MAX_TERM} characters.")
    return cleaned, notes


class PayloadText(Func):
    """PostgreSQL: the first ``PAYLOAD_BYTES`` bytes of the payload as text, the expression
    of ``jobq_job_payload_trgm``. ``encode(…, 'escape')`` never fails whatever the bytes (NUL
    and bytes from 0x80 up become ``\\ooo``, a backslash is doubled), where ``convert_from``
    would fail on msgpack or broken UTF-8, and in an index expression fail the enqueue.
    Elsewhere payloads are matched in Python (``scan_payloads``): SQLite's text functions
    stop at the first NUL byte, which msgpack payloads are full of."""

    output_field = TextField()
    template = f"encode(substring(%(expressions)s from 1 for {PAYLOAD_BYTES}), 'escape')"

    def __init__(self) -> None:
        super().__init__(F("payload"))


class ErrorText(Func):
    """The error as "type: message traceback", cut at ``ERROR_CHARS``; empty for an error
    that is not a JSON object. PostgreSQL: the expression of ``jobq_job_error_trgm``."""

    output_field = TextField()
    PARTS = ("type", "message", "traceback")

    def __init__(self) -> None:
        super().__init__(F("error"))

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        a, b, c = (f"coalesce(%(expressions)s->>'{part}', '')" for part in self.PARTS)
        template = f"left({a} || ': ' || {b} || ' ' || {c}, {ERROR_CHARS})"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        a, b, c = (f"coalesce(json_extract(%(expressions)s, '$.{p}'), '')" for p in self.PARTS)
        template = (
            f"CASE WHEN json_valid(%(expressions)s) THEN "
            f"substr({a} || ': ' || {b} || ' ' || {c}, 1, {ERROR_CHARS}) ELSE '' END"
        )
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        a, b, c = (f"JSON_UNQUOTE(JSON_EXTRACT(%(expressions)s, '$.{p}'))" for p in self.PARTS)
        template = f"LEFT(CONCAT_WS(' ', {a}, {b}, {c}), {ERROR_CHARS})"
        return self.as_sql(compiler, connection, template=template, **extra)


class Contains(Func):
    """``text`` contains ``pattern`` (a LIKE pattern, wildcards in the term escaped), letter
    case aside: ``ILIKE`` on PostgreSQL (what the trigram index serves), ``LIKE`` elsewhere
    (SQLite's and MySQL's LIKE ignore ASCII case)."""

    output_field = BooleanField()

    def __init__(self, text: Func, pattern: str) -> None:
        super().__init__(text)
        self.pattern = pattern

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:  # type: ignore[override]
        lhs, params = compiler.compile(self.source_expressions[0])
        if connection.vendor == "postgresql":
            return f"{lhs} ILIKE %s", (*params, self.pattern)
        return f"{lhs} LIKE %s ESCAPE '\\'", (*params, self.pattern)


def like_pattern(text: str) -> str:
    """``%text%`` with LIKE's wildcards and escape character in ``text`` matching
    themselves."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def escaped_bytes(term: str) -> str:
    """``term``'s UTF-8 bytes as PostgreSQL's ``encode(…, 'escape')`` writes them, so the
    term is compared with the payload text in the same form."""
    out = []
    for byte in term.encode("utf-8"):
        if byte == 0 or byte >= 0x80:
            out.append(f"\\{byte:03o}")
        elif byte == 0x5C:
            out.append("\\\\")
        else:
            out.append(chr(byte))
    return "".join(out)


#: How long an absent index is believed absent: ``manage.py jobq_search_index`` may create it
#: while the site runs, and the next searches should use it without a restart.
RECHECK_SECONDS = 60.0

PAYLOAD_INDEX_SQL = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobq_job_payload_trgm ON django_jobq_job USING "
    "gin ((encode(substring(payload from 1 for 500), 'escape')) gin_trgm_ops)"
)
PAYLOAD_STATISTICS_SQL = (
    "CREATE STATISTICS IF NOT EXISTS jobq_job_payload_text ON "
    "(encode(substring(payload from 1 for 500), 'escape')) FROM django_jobq_job"
)


def index_present(alias: str, name: str) -> bool:
    """Whether the trigram index ``name`` exists on PostgreSQL database ``alias``: found, it
    is remembered for the process; absent, asked again after ``RECHECK_SECONDS``."""
    key = (alias, name)
    known = _indexes_present.get(key)
    if known is None or (not known[0] and time.monotonic() - known[1] > RECHECK_SECONDS):
        connection = connections[alias]
        present = False
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [name])
                present = cursor.fetchone() is not None
        _indexes_present[key] = known = (present, time.monotonic())
    return known[0]


def newest(queryset: QuerySet, rows: int) -> tuple[QuerySet, dt.datetime | None]:
    """The newest ``rows`` jobs of ``queryset`` (by creation time, along the list's index),
    and the creation time they start at; the whole queryset and None when it has fewer."""
    bound = queryset.order_by("-created_at", "-id").values_list("created_at", flat=True)[
        rows - 1 : rows
    ]
    since = next(iter(bound), None)
    if since is None:
        return queryset, None
    return queryset.filter(created_at__gte=since), since


def scan_payloads(scoped: QuerySet, term: str) -> QuerySet:
    """Jobs of ``scoped`` (a bounded set: ``newest``) whose first ``PAYLOAD_BYTES`` bytes
    contain ``term`` in UTF-8, ASCII case aside, compared as bytes in Python: what any
    payload holds (msgpack, NUL bytes, broken UTF-8) is compared as it is."""
    needle = term.encode("utf-8").lower()
    heads = scoped.order_by().annotate(head=Substr("payload", 1, PAYLOAD_BYTES))
    found = [
        pk for pk, head in heads.values_list("pk", "head") if needle in bytes(head or b"").lower()
    ]
    return scoped.filter(pk__in=found)


def text_search(queryset: QuerySet, where: str, term: str) -> tuple[QuerySet, str | None]:
    """Jobs of ``queryset`` whose payload (``where="payload"``) or error (``"error"``)
    contains ``term``, and a note to show when not every job was searched."""
    vendor = connections[queryset.db].vendor
    payload = where == "payload"
    if vendor == "postgresql":
        text: Func = PayloadText() if payload else ErrorText()
        matches = Contains(text, like_pattern(escaped_bytes(term) if payload else term))
        base = queryset if payload else queryset.filter(error__isnull=False)
        indexed = index_present(queryset.db, PAYLOAD_INDEX if payload else ERROR_INDEX)
        if indexed and TRIGRAM_WORD.search(term):
            return base.filter(matches), None
    scoped, since = newest(queryset, SCAN_ROWS)
    if payload:
        found = scan_payloads(scoped, term)
    else:
        found = scoped.filter(Contains(ErrorText(), like_pattern(term)), error__isnull=False)
    if since is None:
        return found, None
    if vendor != "postgresql":
        why = "only PostgreSQL with pg_trgm searches every job"
    elif indexed:
        why = "a term without 3 letters or digits in a row cannot use the search index"
    else:
        why = (
            "the search index is not installed (manage.py jobq_search_index creates it)"
            if payload
            else "the pg_trgm search index is not installed on this database (docs/admin.md)"
        )
    note = (
        f"Searched the {where}s of the newest {SCAN_ROWS:,} jobs of this list (created since "
        f"{since:%Y-%m-%d %H:%M:%S} UTC); older jobs were not searched: {why}."
    )
    return found, note
