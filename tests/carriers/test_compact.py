"""`common.compact` (a part's text for estimates and identities) writes exactly what
`json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)` writes, for every
JSON value the strict reader can produce; it reuses one C encoder across calls and threads."""

from __future__ import annotations

import json
import threading
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.carriers.common import compact

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5), max_leaves=40
)


def reference(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@given(VALUES)
@settings(max_examples=300, deadline=None)
def test_compact_is_the_sorted_compact_dump(value: Any) -> None:
    assert compact(value) == reference(value)


def test_compact_fixed_cases_and_threads() -> None:
    cases: list[Any] = [
        {"b": 1, "a": [True, None, 1.5, "é\u2028\ud800"], "c": {"z": {}, "y": []}},
        "only a string",
        7,
        [],
        {"tool_call_id": "call_1", "name": "search", "arguments": '{"q": "x"}'},
    ]
    for case in cases:
        assert compact(case) == reference(case)
    failures: list[str] = []

    def run() -> None:
        for _ in range(300):
            for case in cases:
                if compact(case) != reference(case):
                    failures.append(repr(case))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
