"""The inspection engine as compiled from a policy: Hyperscan and the documented slow
engine agree; benign traffic passes; advisory rules never block alone; detectors; the
match cap and every failure fail closed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.config.load import ConfigError, load_runtime
from gateway.inspection import detectors
from gateway.inspection.build import EngineUnavailable, build_engine
from gateway.inspection.engine import Engine, FormatInfo, Subject
from gateway.inspection.formats import FormatSet, build_format_set
from gateway.vocab import Decision
from tests.inspection.secret_samples import true_positives

CORPUS = Path(__file__).parent / "inspection" / "benign_corpus"
LIMITS = CarrierLimits()
LITERALS = ["configured-secret-value-1", 'quote"and\\slash/value']
ALL_DETECTORS = {"email": "required", "phone": "advisory", "card": "required", "iban": "required", "us_ssn": "required"}


def _formats(detector_modes: dict[str, str] | None = None, **kw: Any) -> FormatSet:
    return build_format_set(
        use_catalogue=True,
        disable=kw.get("disable", ()),
        advisory=kw.get("advisory", ()),
        custom=kw.get("custom"),
        detector_modes=detector_modes or {},
    )


def _engine(kind: str = "hyperscan", detector_modes: dict[str, str] | None = None, **kw: Any) -> Engine:
    return build_engine(
        secret_values=kw.pop("values", LITERALS),
        formats=_formats(detector_modes, **kw),
        policy_version="t",
        engine=kind,
        max_matches=kw.pop("max_matches", 100_000),
    )


def _chat_subject(text: str) -> Subject:
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, LIMITS)
    return Subject(raw=raw, units=parsed.units, opaque=parsed.opaque, duplicate_keys=parsed.duplicate_keys)


HS = _engine("hyperscan")
PY = _engine("python")


def _documents() -> list[str]:
    docs = [p.read_text() for p in sorted(CORPUS.iterdir())]
    for rule in (
        "aws-access-key-id",
        "github-pat",
        "jwt",
        "private-key-ec",
        "stripe-live-secret-key",
        "postgres-connection-uri",
        "slack-webhook-url",
        "generic-api-key",
    ):
        for sample in true_positives(rule, n=3, seed=99):
            docs.append(f"Here is some context.\n{sample}\nand more text")
    docs += [f"literal {LITERALS[0]} inside", f"escaped {LITERALS[1]}"]
    return docs


@pytest.mark.parametrize("doc", _documents(), ids=lambda d: hashlib.sha1(d.encode()).hexdigest()[:8])
def test_hyperscan_and_slow_engine_agree(doc: str) -> None:
    subject = _chat_subject(doc)
    a, b = HS.inspect(subject), PY.inspect(subject)
    assert (a.decision, a.reason_codes) == (b.decision, b.reason_codes)
    assert sorted((f.reason, f.pointer or "", f.advisory) for f in a.findings) == sorted(
        (f.reason, f.pointer or "", f.advisory) for f in b.findings
    )


@pytest.mark.parametrize("path", sorted(CORPUS.iterdir()), ids=lambda p: p.name)
def test_benign_corpus_is_allowed(path: Path) -> None:
    text = path.read_text()
    for subject in (_chat_subject(text), _chat_subject(json.dumps({"file": text}))):
        verdict = HS.inspect(subject)
        assert verdict.decision is Decision.ALLOW, (path.name, verdict.reason_codes)
        assert all(f.advisory for f in verdict.findings)


def test_documented_example_keys_are_allowed() -> None:
    for example in ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"):
        assert HS.inspect(_chat_subject(f"aws example {example}")).allowed


def test_advisory_rule_alone_never_blocks() -> None:
    subject = _chat_subject('config: api_key = "Zq8rT1vX9mK2pL7wQ4sN6bY3"')
    verdict = HS.inspect(subject)
    assert verdict.allowed
    assert any(f.advisory and f.reason.startswith("secret_format:generic-") for f in verdict.findings)
    demoted = _engine(advisory=("aws-access-key-id",))
    key = true_positives("aws-access-key-id", n=1, seed=3)[0]
    assert demoted.inspect(_chat_subject(key)).allowed
    assert not HS.inspect(_chat_subject(key)).allowed
    disabled = _engine(disable=("aws-access-key-id",))
    assert disabled.inspect(_chat_subject(key)).allowed


def test_custom_rule_from_policy() -> None:
    custom = json.dumps(
        {
            "version": "acme-1",
            "rules": [
                {
                    "id": "acme-internal-token",
                    "description": "ACME internal service token",
                    "keywords": ["acme_"],
                    "pattern": "acme_[a-z0-9]{24}",
                    "min_entropy": 3.0,
                }
            ],
        }
    ).encode()
    engine = _engine(custom=custom)
    verdict = engine.inspect(_chat_subject("token acme_k3j4h5g6f7d8s9a0q1w2e3r4 here"))
    assert verdict.reason_codes == ("secret_format:acme-internal-token",)


@pytest.mark.parametrize(
    "text,reason",
    [
        ("mail me at jane.doe+test@example.co.uk please", "pii:email"),
        ("card 4111 1111 1111 1111 exp 12/29", "pii:card"),
        ("card 5500-0000-0000-0004", "pii:card"),
        ("IBAN GB82 WEST 1234 5698 7654 32 thanks", "pii:iban"),
        ("ssn 078-05-1120", "pii:us_ssn"),
    ],
)
def test_required_detectors_block(text: str, reason: str) -> None:
    engine = _engine(detector_modes=ALL_DETECTORS)
    verdict = engine.inspect(_chat_subject(text))
    assert verdict.decision is Decision.BLOCK and reason in verdict.reason_codes


@pytest.mark.parametrize(
    "text",
    [
        "order 4111 1111 1111 1112",  # fails Luhn
        "GB82 WEST 1234 5698 7654 33",  # fails mod 97
        "ssn 000-12-3456 or 666-12-3456",  # never issued
        "version 1.2.3 and uuid 123e4567-e89b-12d3-a456-426614174000",
        "user@localhost has no domain",
    ],
)
def test_detectors_ignore_near_misses(text: str) -> None:
    engine = _engine(detector_modes=ALL_DETECTORS)
    verdict = engine.inspect(_chat_subject(text))
    assert verdict.allowed, verdict.reason_codes


def test_advisory_detector_records_without_blocking() -> None:
    engine = _engine(detector_modes={"phone": "advisory", "email": "advisory"})
    verdict = engine.inspect(_chat_subject("call +1 415-555-0132 or mail a.b@corp.example.org"))
    assert verdict.allowed
    assert {f.reason for f in verdict.findings} == {"pii:phone", "pii:email"}


def test_luhn_and_iban_helpers() -> None:
    assert detectors.luhn_ok(b"4111111111111111") and not detectors.luhn_ok(b"4111111111111112")
    assert detectors.iban_ok(b"DE89370400440532013000") and not detectors.iban_ok(b"DE89370400440532013001")


@pytest.mark.parametrize("kind", ["hyperscan", "python"])
def test_match_cap_fails_closed_and_both_engines_agree(kind: str) -> None:
    """The cap counts confirmed matches, the same in both engines: past it the scan is
    incomplete and the call is withheld; at or below it the matches decide."""
    engine = _engine(kind, values=LITERALS, max_matches=100)
    keys = true_positives("aws-access-key-id", n=120, seed=8)
    over = engine.inspect(_chat_subject(" ".join(keys)))
    assert not over.allowed and "match_limit" in over.reason_codes
    under = engine.inspect(_chat_subject(" ".join(keys[:30])))
    assert under.decision is Decision.BLOCK and "match_limit" not in under.reason_codes


def test_candidate_guard_bounds_confirmation_work() -> None:
    """Many candidates that never confirm (low-entropy look-alikes): the Hyperscan engine
    stops after `max_candidates` raw candidates and withholds instead of confirming them all."""
    engine = build_engine(
        secret_values=LITERALS, formats=_formats(), policy_version="t", max_matches=100, max_candidates=50
    )
    text = " ".join(f"ghp_{'a' * 30}{i:06d}" for i in range(200))
    verdict = engine.inspect(_chat_subject(text))
    assert not verdict.allowed and "match_limit" in verdict.reason_codes
    assert HS.inspect(_chat_subject(text)).allowed  # the default guard is far above this


class _Raising:
    """A real FormatSource whose confirmation breaks, as a buggy rule would."""

    def __init__(self, trigger: bytes, error: Exception) -> None:
        self.trigger, self.error = trigger, error

    def infos(self) -> Sequence[FormatInfo]:
        return [FormatInfo("explodes", False, "secret_format:explodes")]

    def patterns(self) -> Sequence[str]:
        return ["BOOM-[0-9]{4}"]

    def confirm(self, index: int, data: bytes, end: int) -> list[tuple[int, int]]:
        raise self.error

    def full_scan(self, data: bytes) -> list[tuple[int, int, int]]:
        raise self.error


def test_a_rule_that_raises_withholds_in_checks(make_env: Any) -> None:
    from gateway.checks import runner
    from gateway.vocab import Phase

    env = make_env()
    runtime = load_runtime(env.config)
    broken = build_engine(secret_values=[], formats=_Raising(b"", RuntimeError("bug")), policy_version="t")
    runtime = dataclasses.replace(runtime, policy=dataclasses.replace(runtime.policy, engine=broken))
    party = runner.Party("tester", None, "default", runtime.profiles["mock-openai"])
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "BOOM-1234"}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, LIMITS)
    given = runner.SendInput(party=party, parsed=(parsed,), body=raw, bound_headers={}, carriers="openai.chat")
    outcome = runner.before_send(runtime, given, route=None)
    assert outcome.phase is Phase.BEFORE_SEND
    assert outcome.verdict.decision is Decision.WITHHOLD and outcome.verdict.reason_codes == ("inspection_error",)
    assert outcome.binding is None
    detector_broken = build_engine(
        secret_values=[], formats=_Raising(b"", detectors.DetectorFailure("card")), policy_version="t"
    )
    runtime = dataclasses.replace(runtime, policy=dataclasses.replace(runtime.policy, engine=detector_broken))
    outcome = runner.before_send(runtime, given, route=None)
    assert outcome.verdict.reason_codes == ("detector_unavailable",)


def test_missing_hyperscan_is_loud_not_silent(make_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hyperscan", None)  # import hyperscan → ImportError
    with pytest.raises(EngineUnavailable, match="hyperscan package cannot be imported"):
        _engine("hyperscan")
    env = make_env()
    with pytest.raises(ConfigError, match="hyperscan"):
        load_runtime(env.config)
    (env.dir / "policy.toml").write_text(
        (env.dir / "policy.toml").read_text().replace('engine = "hyperscan"', 'engine = "python"')
    )
    runtime = load_runtime(env.config)  # the documented slow engine, chosen explicitly
    assert runtime.policy.engine.matcher.engine == "python"


def test_a_rule_that_raises_releases_nothing_end_to_end(make_env: Any, gateway_for: Any, mock: Any) -> None:
    import uuid

    from tests.harness import raw_client

    env = make_env()
    gateway = gateway_for(env)
    assert gateway.running is not None
    holder = gateway.running.holder
    broken = build_engine(secret_values=[], formats=_Raising(b"", RuntimeError("bug")), policy_version="test-1")
    holder.swap(dataclasses.replace(holder.current, policy=dataclasses.replace(holder.current.policy, engine=broken)))
    client = raw_client(gateway, env)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    before = len(mock.state.records())
    r = client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "BOOM-1234"}]},
    )
    assert r.status_code == 503 and r.json()["error"]["reason_codes"] == ["inspection_error"]
    assert len(mock.state.records()) == before  # nothing sent
    for stream in (False, True):
        sid = "x" + uuid.uuid4().hex[:10]
        mock.state.add_scenario(sid, [{"text": "the model says BOOM-9876 here"}])
        r = client.post(
            "/v1/chat/completions",
            headers=headers,
            json={
                "model": "gpt-4.1",
                "stream": stream,
                "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
            },
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "response_withheld"
        assert "BOOM" not in r.text and "the model says" not in r.text


def test_a_bare_form_is_found_in_the_first_unit_of_a_buffer() -> None:
    """Bare forms consume the byte before their value; every joined buffer starts with a
    separator so the first unit (here the document's first key, written with escaped
    slashes so the raw bytes do not show it) has one."""
    key = next(k for k in true_positives("aws-secret-access-key-bare", n=20, seed=5) if "/" in k)
    raw = ('{"%s": 1, "model": "gpt-4.1", "messages": []}' % key.replace("/", "\\/")).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, LIMITS)
    assert parsed.units[0].text == key
    for engine in (HS, PY):
        verdict = engine.inspect(Subject(raw=raw, units=parsed.units))
        assert "secret_format:aws-secret-access-key-bare" in verdict.reason_codes


@pytest.mark.parametrize("engine", [HS, PY], ids=["hyperscan", "python"])
def test_a_value_split_across_nested_parts_around_a_cache_marker_is_found(engine: Engine) -> None:
    """A cache marker's `ttl` between two text parts of a tool result labels structure: the
    text read in order skips it, so a configured value split across the parts reads whole."""
    value = LITERALS[0]
    first = {"type": "text", "text": "see " + value[:10], "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [first, {"type": "text", "text": value[10:]}]}
    doc = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": [result]}]}
    raw = json.dumps(doc).encode()
    parsed = CARRIERS["anthropic.messages"].parse_request(raw, LIMITS)
    verdict = engine.inspect(Subject(raw=raw, units=parsed.units))
    assert verdict.reason_codes == ("secret_value",)
