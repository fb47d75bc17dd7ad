"""OpenAI Embeddings: bytes in, values out."""

from __future__ import annotations

import json

import pytest

from gateway.carriers import CARRIERS
from tests.carriers.helpers import LIMITS, units


@pytest.mark.parametrize(
    "inputs,opaque",
    [
        ("one string", ()),
        (["a", "b"], ()),
        ([1, 2, 3], ("/input",)),
        ([[1, 2], [3]], ("/input/0", "/input/1")),
    ],
)
def test_openai_embeddings_inputs(inputs: object, opaque: tuple[str, ...]) -> None:
    parsed = CARRIERS["openai.embeddings"].parse_request(
        json.dumps({"model": "text-embedding-3-small", "input": inputs, "encoding_format": "base64"}).encode(), LIMITS
    )
    assert parsed.opaque == opaque
    if isinstance(inputs, str):
        assert units(parsed)["/input"] == {"one string"}


def test_openai_embeddings_response_skips_float_vectors_and_reads_base64_ones() -> None:
    floats = json.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25e-3]}],
            "model": "m",
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }
    ).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(floats, LIMITS)
    assert folded.complete and not folded.raw_scan
    assert all(u.text not in ("0.5", "-1.25e-3") for u in folded.units)
    assert folded.usage is not None and folded.usage.fields["prompt_tokens"] == 2
    # a base64 vector is a unit: the engine decodes it and scans the bytes
    b64 = json.dumps(
        {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "AAAAPw=="}], "model": "m"}
    ).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(b64, LIMITS)
    assert folded.complete and not folded.raw_scan
    assert units(folded)["/data/0/embedding"] == {"AAAAPw=="}


@pytest.mark.parametrize(
    "data",
    [
        '"text"',
        '{"a": "b"}',
        '[{"embedding": "not base64!"}]',
        '[{"embedding": {"x": 1}}]',
        '[{"embedding": [1, "two"]}]',
        "[]",
        '[{"index": 0}]',
    ],
)
def test_openai_embeddings_response_of_unexpected_shape_is_read_in_full(data: str) -> None:
    raw = ('{"object":"list","model":"m","data":%s}' % data).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(raw, LIMITS)
    assert folded.complete and folded.raw_scan


def test_schema_facts_and_usage() -> None:
    emb = CARRIERS["openai.embeddings"]
    assert (emb.short_name, emb.route, emb.cache_style, emb.requested_output({})) == (
        "embeddings",
        "/v1/embeddings",
        None,
        0,
    )
    counts = emb.usage_counts({"prompt_tokens": 6, "total_tokens": 6})
    assert counts["input_total"].value == 6 and counts["output"].value == 0
    assert [p.text for p in emb.prompt_layout({"input": ["a", "b"]}).parts] == ["a", "b"]
