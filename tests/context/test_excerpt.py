"""Topic-memory detail excerpts: the `markdown-v1` chunks, the best chunk, the snippet window.

PowerContext 1.4.1's own chunking and snippet functions (the pinned `powercontext` package of
the dev environment) are the oracle where they run in-process: Latin text, and queries without
1.4.1's stopwords (its analyzer drops those and segments Han text with jieba; wiregate's
analyzer v1 does neither, so such queries may focus elsewhere, on purpose).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context import excerpt, search

chunking = pytest.importorskip("powercontext.builtin.artifacts.topic_memory.chunking")
fusion = pytest.importorskip("powercontext.builtin.artifacts.topic_memory.fusion")

PIECES = [
    " billing ",
    " ledger ",
    " cents ",
    " ",
    "\n",
    "\n\n",
    "\n \t\n",
    "# Head ",
    "## x",
    "- item ",
    "* it",
    "1. one ",
    "2) two",
    ". ",
    "! ",
    "?\n",
    "。",
    "x" * 60,
    "word " * 40,
    " é ",
    " e\u0301 ",
    "\t",
    " Billing ",
    "ß ",
    " ＡＢ ",
]
details = st.lists(st.sampled_from(PIECES), min_size=1, max_size=160).map("".join).filter(str.strip)
QUERIES = ["billing", "billing ledger", "cents ledger billing", "xxxxx", "head item"]


@settings(max_examples=120, deadline=None)
@given(detail=details)
def test_chunks_are_1_4_1s(detail: str) -> None:
    assert excerpt.chunks(detail) == [c.text for c in chunking.chunk_topic_memory_detail(detail)]


@settings(max_examples=120, deadline=None)
@given(detail=details, query=st.sampled_from(QUERIES))
def test_snippets_are_1_4_1s(detail: str, query: str) -> None:
    for chunk in excerpt.chunks(detail)[:2]:
        assert excerpt.snippet(search.terms(query), chunk) == fusion._snippet(query, chunk, lexical=True)


def test_positions_map_back_through_normalisation_as_1_4_1_maps_them() -> None:
    # combining marks, case folding that grows (ß, ﬁ, İ), and Hangul jamo that compose across
    # characters of no combining class (the slow path)
    for value in ("e\u0301x", "Straße ﬁ İx", "\u1100\u1161\u11a8 billing", "A\u030a\u1100\u1161ß", "\uac00\u11a8"):
        assert excerpt._source_spans(value) == list(fusion._normalized_spans(value)[1])


def test_snippet_windows_480_characters_on_the_terms_cluster() -> None:
    terms = search.terms("billing ledger")
    assert excerpt.snippet(terms, "  short\n\ntext\t here ") == "short text here"
    text = " ".join(["filler"] * 200 + ["billing", "and", "ledger"] + ["filler"] * 200)
    out = excerpt.snippet(terms, text)
    assert len(out) == excerpt.SNIPPET_CHARS and out.startswith("…") and out.endswith("…")
    middle = out.index("billing and ledger") + len("billing and ledger") // 2
    assert abs(middle - len(out) // 2) <= 2  # centred on the cluster
    head = excerpt.snippet(terms, "billing " + "filler " * 200)
    assert head.startswith("billing") and head.endswith("…") and len(head) == excerpt.SNIPPET_CHARS
    none = excerpt.snippet(search.terms("absent"), "a" * 1000)
    assert none == "…" + "a" * 478 + "…"  # no term: the middle


def test_best_chunk_holds_the_most_terms_then_the_first() -> None:
    detail = "\n\n".join(
        [
            "ledger " * 200,  # one term
            "billing ledger " * 100,  # both terms
            "billing " * 200,
            "billing ledger " * 100,  # both again, later
        ]
    )
    terms = search.terms("billing ledger")
    parts = excerpt.chunks(detail)
    assert len(parts) == 4
    assert excerpt.best_chunk(terms, detail, 1) == parts[1]
    assert excerpt.best_chunk(terms, detail, 3) is None  # no chunk holds three terms
    assert excerpt.best_chunk(search.terms("absent"), detail, 1) is None
    topic = {"title": "Ledger", "summary": "cents", "detail": detail}
    assert excerpt.topic_channels(terms, topic, 1) == (excerpt.TOPIC_CHANNEL, excerpt.DETAIL_CHANNEL)
    assert excerpt.topic_channels(search.terms("cents"), topic, 1) == (excerpt.TOPIC_CHANNEL,)
    assert excerpt.topic_channels(search.terms("billing"), topic, 1) == (excerpt.DETAIL_CHANNEL,)
    assert excerpt.detail_snippet(search.terms("cents"), detail, 1) is None
