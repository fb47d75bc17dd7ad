"""`content.compact_json` writes what the reference `json.dumps(..., ensure_ascii=False,
separators=(",", ":"))` writes, byte for byte, for every document the context layer renders
(strings of any valid Unicode, integers of any size, booleans, null, nested lists and objects),
and refuses what the reference refuses."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context.content import compact_json

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)  # every valid scalar value
SCALARS = st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**200), max_value=2**200) | TEXT
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TEXT, inner, max_size=6),
    max_leaves=40,
)


def reference(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(DOCS)
def test_it_writes_the_reference_bytes(value: Any) -> None:
    assert compact_json(value) == reference(value)


def test_controls_separators_quotes_and_tuples_are_written_as_the_reference_writes_them() -> None:
    class Kind(enum.StrEnum):
        FACT = "fact"

    value = {
        "s": 'a"b\\c\n\t\x00\x1f\x7f\u0085\u2028\u2029é😀',
        "t": ("x", 1),
        "k": Kind.FACT,
        "n": [None, True, False, 0, -1],
        "f": [0.5, 0.001, 1e16, -0.0],
    }
    assert compact_json(value) == reference(value)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False))
def test_a_float_reads_back_as_the_same_number(value: float) -> None:
    """Below 1e-4 the spelling may differ from Python's (`1e-7` for `1e-07`), never the number."""
    assert json.loads(compact_json([value])) == [value]


@pytest.mark.parametrize("value", [{"x": "\ud800"}, {"\udfff": 1}])
def test_a_lone_surrogate_is_refused_as_the_reference_refuses_it(value: Any) -> None:
    with pytest.raises(UnicodeEncodeError):
        compact_json(value)
