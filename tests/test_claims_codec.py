"""The binding claims codec: every kind round-trips through encode/decode, and any claim
that is missing, of the wrong type or under another version makes the binding invalid
(another kind is the wrong phase)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.checks.bindings import BindingError
from gateway.checks.claims import ReleaseClaims, ReuseClaims, SendClaims, decode

COMMON: dict[str, Any] = dict(
    key_id="k1", audience="dep", issued_at=100, expires_at=160, id="ab12", principal="p", delegate=None, scope="s"
)
SAMPLES = [
    SendClaims(
        **COMMON, phase="before_send", profile_id="prof", profile_digest="d" * 64, policy_version="v1",
        decision="allow", mode="enforce", carriers="openai.chat", body_digest="b" * 64, headers_digest="h" * 64,
        correlate_until=400,
    ),
    ReleaseClaims(
        **COMMON, phase="before_release", profile_id="prof", profile_digest="d" * 64, policy_version="v1",
        decision="allow", request_binding_digest="r" * 64, body_digest="b" * 64,
    ),
    ReuseClaims(**{**COMMON, "delegate": "agent"}, content_digest="sha256:" + "c" * 64, dependencies=({"a": 1},)),
]  # fmt: skip
IDS = [type(c).__name__ for c in SAMPLES]


@pytest.mark.parametrize("claims", SAMPLES, ids=IDS)
def test_every_kind_round_trips(claims: Any) -> None:
    data = claims.encode()
    assert data["v"] == 1 and data["kind"] == type(claims).KIND
    assert len(data) == len(dataclasses.fields(claims)) + 2  # every claim under its wire key
    assert decode(type(claims), data) == claims


@pytest.mark.parametrize("claims", SAMPLES, ids=IDS)
def test_a_missing_or_mistyped_claim_is_invalid(claims: Any) -> None:
    data = claims.encode()
    for key in data.keys() - {"v", "kind"}:
        missing = {k: v for k, v in data.items() if k != key}
        with pytest.raises(BindingError) as caught:
            decode(type(claims), missing)
        assert caught.value.reason == "binding_invalid", key
        # A bool is never an int or a string here; a number is never a string; a
        # dependency list holds objects only.
        wrong: Any = True if data[key] is None else (["x"] if isinstance(data[key], list) else [])
        with pytest.raises(BindingError) as caught:
            decode(type(claims), {**data, key: wrong})
        assert caught.value.reason == "binding_invalid", key
    for key, value in data.items():
        if isinstance(value, int) and key not in {"v"}:
            with pytest.raises(BindingError) as caught:
                decode(type(claims), {**data, key: True})
            assert caught.value.reason == "binding_invalid", key


@pytest.mark.parametrize("claims", SAMPLES, ids=IDS)
def test_another_version_is_invalid_and_another_kind_the_wrong_phase(claims: Any) -> None:
    data = claims.encode()
    with pytest.raises(BindingError) as caught:
        decode(type(claims), {**data, "v": 2})
    assert caught.value.reason == "binding_invalid"
    for other in SAMPLES:
        if type(other) is not type(claims):
            with pytest.raises(BindingError) as caught:
                decode(type(other), data)
            assert caught.value.reason == "binding_phase"
