"""Hostile inputs, as hypothesis strategies shared by the Python API and REST API tests.

What a careless or hostile caller sends: floats JSON cannot carry (NaN, ±Infinity), nesting
deep enough to exhaust the interpreter's stack, strings far past any size limit, text that is
not valid UTF-8 once encoded (lone surrogates) or that databases treat specially (NUL), text
that renders misleadingly (right-to-left marks, zero-width joiners, emoji), and ids and queue
names that try to escape a Redis key or hash tag (``/``, ``{}``, ``*``, spaces, very long,
empty). Each strategy mixes these with ordinary values, so a property sees both.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

# JOBQ_MODEL_LONG=1: the long run (random examples, ten times as many); otherwise CI's size,
# derandomized so that CI never meets a new example.
LONG = os.environ.get("JOBQ_MODEL_LONG") == "1"


def hostile_settings(ci_examples: int) -> settings:
    """Settings of the hostile-input property tests (Python API and REST API alike)."""
    return settings(
        max_examples=ci_examples * 10 if LONG else ci_examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        # No explain phase: its line tracer overflows the stack on the deep values drawn here
        # and reports a RecursionError instead of the failing example.
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        suppress_health_check=[
            HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
            HealthCheck.data_too_large, HealthCheck.large_base_example,
        ],
    )  # fmt: skip


NON_FINITE = (float("nan"), float("inf"), float("-inf"))
ODD_CHARS = "\x00\u202e\u200f\u200d\ufeff\U0001f4a9\U0001f9d1\u200d\U0001f680/\\{}*?[]: \t\n\"'%"


def odd_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text with NUL, bidi and zero-width marks, emoji, key-syntax characters and, sometimes,
    a lone surrogate (valid in a Python str, not encodable as UTF-8)."""
    plain = st.text(st.sampled_from(ODD_CHARS) | st.characters(), max_size=max_size)
    lone = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud83d"])
    return plain | st.tuples(plain, lone).map("".join)


class Built:
    """A value too big to print (hypothesis prints a failing example's arguments, and printing
    a 100,000-deep list overflows the stack): it shows as its recipe, and ``build()`` makes
    it, without recursion."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind, self.size = kind, size

    def __repr__(self) -> str:
        return f"Built({self.kind!r}, {self.size})"

    def build(self) -> Any:
        if self.kind == "text":
            return "x" * self.size
        value: Any = 1
        for _ in range(self.size):
            value = [value] if self.kind == "list" else {"k": value}
        return value


def built(value: Any) -> Any:
    """The value a strategy drew, with ``Built`` recipes made into their values."""
    return value.build() if isinstance(value, Built) else value


deep_values = st.builds(
    Built, st.sampled_from(["list", "dict"]), st.sampled_from([5, 64, 200, 1_000, 5_000, 100_000])
)
huge_strings = st.builds(Built, st.just("text"), st.sampled_from([10_000, 300_000, 2_000_000]))
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(NON_FINITE)
scalars = (
    st.none() | st.booleans() | st.integers() | floats | odd_text()
    | st.integers(-(2**80), 2**80)
)  # fmt: skip

json_like = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(odd_text(12), children, max_size=4)
        # Keys JSON would turn into strings: {1: "x", "1": "y"} read back as {"1": "y"}.
        | st.dictionaries(
            odd_text(3)
            | st.integers(-2, 2)
            | st.none()
            | st.booleans()
            | st.floats(allow_nan=False),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)

#: Payloads and results: ordinary JSON values, poisoned ones and oversized ones (those as
#: ``Built`` recipes: pass every drawn value through ``built``).
hostile_values = json_like | deep_values | huge_strings | floats.map(lambda f: {"x": f})

#: Job ids: mostly invalid ones that aim at key syntax, some valid ones.
hostile_ids = (
    st.sampled_from([
        "", " ", "a b", "a/b", "../etc", "{q}", "a}{b", "*", "job:*", "a\x00b", "\u202eabc",
        "x" * 129, "x" * 10_000, ".hidden", "-dash", "é", "\U0001f4a9", "a\nb",
    ])
    | odd_text(20)
    | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
)  # fmt: skip

#: Queue names, likewise.
hostile_queue_names = (
    st.sampled_from(["", "a b", "q/x", "{q}", "q*", "x" * 65, "é", "q:1", ".q"])
    | odd_text(10)
    | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
)


def same_json(a: Any, b: Any) -> bool:
    """Exact round-trip equality of a JSON value, without recursion (the values may be nested
    100,000 deep): types too (1 is not 1.0 nor True), floats by value, NaN equal to nothing."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, dict):
            if not isinstance(y, dict) or x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list | tuple):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif type(x) is not type(y) or x != y:
            return False
    return True
