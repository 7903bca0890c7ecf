"""docs/settings.md is the contract of the ``JOBQ`` setting: every key it documents must be
accepted with its documented default, and equal the default the code uses. A key documented
but missing from ``conf.DEFAULTS`` (``BROADCASTS`` was) broke every storage build of a user
who set it; a default changed in one place and not the other misleads quietly."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_jobq.backend import check_settings
from django_jobq.conf import DEFAULTS

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
_ROW = re.compile(r"^\| `([A-Za-z_]+)` \| ([^|]+?) \|")
_SECTION = re.compile(r"^`([A-Z_]+)`[ :(]")
_PROSE = re.compile(r"`([a-z_]+)` \(([^ ;),]+)")


def _literal(text: str) -> Any:
    text = text.strip().strip("`")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return ast.literal_eval(text.split(" (")[0].strip("`"))  # "86400000 (24 h)"


def documented() -> dict[str, Any]:
    """{key: default} of the top table, and {SECTION: {key: default}} of each section below
    it (a table, or WORKER's prose list of ``name (default …)``)."""
    found: dict[str, Any] = {}
    section = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            break  # the sections after the reference are guides, not the key list
        if (match := _SECTION.match(line)) and match.group(1) in DEFAULTS:
            section = match.group(1)
            found[section] = {}
            if section == "WORKER":
                prose = line
                continue
        if section == "WORKER" and line and not line.startswith("|"):
            prose += " " + line
            found["WORKER"] = {k: _literal(v) for k, v in _PROSE.findall(prose)}
            continue
        if row := _ROW.match(line):
            key, default = row.groups()
            target = found if section is None else found[section]
            target[key] = "see below" if default.strip() == "see below" else _literal(default)
    return found


DOCUMENTED = documented()


def test_every_setting_the_code_has_is_documented_and_no_other():
    assert set(DOCUMENTED) == set(DEFAULTS)
    assert "see below" not in DOCUMENTED.values(), "a 'see below' with no section below"


@pytest.mark.parametrize("key", sorted(DEFAULTS))
@pytest.mark.django_db  # the check asks the database for its features
def test_each_documented_default_is_the_default_and_is_accepted(key):
    assert DOCUMENTED[key] == DEFAULTS[key], f"docs/settings.md: JOBQ[{key!r}]"
    with override_settings(JOBQ={key: DOCUMENTED[key]}):
        assert check_settings() == []


def test_the_broadcasts_setting_is_the_retention_of_every_broadcast():
    from django_jobq.broadcast import Broadcast
    from django_jobq.storage.memory import MemoryStorage

    with override_settings(JOBQ={"BROADCASTS": {"maxlen": 5, "max_age": None}}):
        retention = Broadcast("news", storage=MemoryStorage()).retention
    assert (retention.maxlen, retention.max_age) == (5, None)
