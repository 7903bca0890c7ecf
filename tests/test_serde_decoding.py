"""The JSON serde decodes what ``json.loads`` decodes, and refuses what it refuses.

``JSONSerde.loads`` decodes UTF-8 itself before ``json.loads`` (which then skips its encoding
detection); these properties hold it to ``json.loads`` on bytes: the same value for every
encoding ``json.loads`` detects (UTF-8 with or without a BOM, UTF-16 and UTF-32 in both byte
orders), and an ``InvalidPayload`` exactly where ``json.loads`` raises, for any bytes at all.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_jobq.errors import InvalidPayload
from django_jobq.serde import JSONSerde

SERDE = JSONSerde()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
             "utf-32-be")  # fmt: skip


def _reference(data: bytes) -> tuple[bool, object]:
    try:
        return True, json.loads(data)
    except (ValueError, RecursionError):
        return False, None


def _decodes_as_json_loads(data: bytes) -> None:
    """The serde's answer is json.loads's: the same value, or InvalidPayload where it raises."""
    ok, expected = _reference(data)
    if ok:
        # Compared by repr: json.loads reads NaN (found by hypothesis: b"NaN"), and NaN is
        # not equal to itself; repr also tells 1 from 1.0 and -0.0 from 0.0.
        assert repr(SERDE.loads(data)) == repr(expected)
    else:
        with pytest.raises(InvalidPayload):
            SERDE.loads(data)


@given(json_values, st.sampled_from(ENCODINGS), st.booleans())
def test_every_encoding_json_detects_decodes_to_the_same_value(value, encoding, ascii_only):
    data = json.dumps(value, ensure_ascii=ascii_only).encode(encoding)
    ok, expected = _reference(data)
    assert ok, "json.loads itself refused an encoding it documents"
    assert SERDE.loads(data) == expected


@given(
    st.binary(max_size=40) | st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_decode_as_json_loads_decodes_them_or_are_refused_as_it_refuses_them(data):
    _decodes_as_json_loads(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf[1]",
        b'{"a":"\xc3\xa9"}',
        b"\x00[\x001\x00]",
        b"",
        b"NaN",
        b"[Infinity,-0.0,1]",
    ],  # fmt: skip
)
def test_edges_bom_accents_nul_empty_and_non_finite(data):
    _decodes_as_json_loads(data)
