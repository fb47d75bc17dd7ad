"""Bare credentials: every catalogue rule's value, standing alone in real request fields.

Some rules only fire next to a name (``aws_secret_access_key = …``, ``DISCORD_TOKEN=…``). The
same value sent bare (a tool-call argument, the ``user`` field, a metadata value or key, a
tool description, or after a name in another language) must still be stopped, or the rule
must say in the catalogue, in ``context_only``, why it cannot be. This module measures it for
the whole catalogue with the real carriers and the real (Hyperscan) engine, and checks:

* the set of rules that miss is exactly the set documented context-only (a new miss fails;
  so does a documented rule that is now always found). A rule misses when one of its values
  goes unreported in some placement, or when its ``<rule>-bare`` form covers less than
  :data:`FULL_COVERAGE` of its values (then the rest is context-only, and says so);
* each ``<rule>-bare`` form keeps its recall on the parent's value distribution, measured on
  600 values. A value its acceptance checks reject (a Beamer key without a digit, about 1
  in 1600) is that recall loss: it is counted there, not as a placement miss, so the result
  does not depend on which dozen values the seed happens to draw;
* the bare forms block nothing in the benign corpus and (within a stated bound) nothing
  among realistic look-alikes: digests, ids, trace ids, encodings, identifiers and paths.

The *value* of a rule's sample is what its secret group captures when the rule is a
name-context rule (the name is what the placement takes away); for a self-identifying rule
it is the whole sample (a prefix such as ``ghp_``, a URL, a PEM block is part of the value).
"""

from __future__ import annotations

import base64
import collections
import functools
import json
import pathlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hyperscan
import pytest

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection import catalogue as catmod
from gateway.inspection.build import build_engine
from gateway.inspection.catalogue import Catalogue, Rule, confirm_regex, load_catalogue, reference_scan
from gateway.inspection.engine import Subject
from gateway.inspection.formats import build_format_set
from gateway.inspection.verdict import Verdict
from gateway.vocab import SECRET_FORMAT_PREFIX

from . import lookalikes
from . import secret_samples as ss

CAT = load_catalogue()
RULES: dict[str, Rule] = {r.id: r for r in CAT.rules}
BARE_SUFFIX = "-bare"
BARE_RULES = [r for r in CAT.rules if r.id.endswith(BARE_SUFFIX)]
CORPUS = pathlib.Path(__file__).with_name("benign_corpus")

#: Rules with a secret group whose whole match is still the value people send: a URL with
#: credentials in it, a webhook URL, a PEM / PuTTY key block, a Telegram token (``bot`` is the
#: URL path before it). Every other rule with a secret group is a name-context rule: its
#: prefix (a variable or field name, an auth scheme, a ``Key=`` label) can be dropped, moved
#: into a JSON key or said in another language.
SELF_IDENTIFYING = frozenset(
    {
        "private-key-rsa",
        "private-key-dsa",
        "private-key-ec",
        "private-key-openssh",
        "private-key-pgp",
        "private-key-pkcs8",
        "private-key-pkcs8-encrypted",
        "putty-private-key",
        "postgres-connection-uri",
        "mysql-connection-uri",
        "mongodb-connection-uri",
        "redis-connection-uri",
        "amqp-connection-uri",
        "url-embedded-credentials",
        "jdbc-connection-password",
        "azure-sas-token",
        "slack-webhook-url",
        "slack-workflow-webhook-url",
        "discord-webhook-url",
        "msteams-webhook-url",
        "telegram-bot-token",
    }
)
#: Where the secret group is only part of the value: the service-account key's value is the
#: whole PEM block held in the JSON string (its group is the first 40 base64 characters).
VALUE_OF: dict[str, Callable[[str], str]] = {
    "gcp-service-account-private-key": lambda s: json.loads("{" + s.rstrip(",") + "}")["private_key"],
}

#: Names in other languages the value follows (the issue's four, and seven more).
FOREIGN = (
    "密钥: ",
    "clave=",
    "Schlüssel: ",
    "パスワード：",
    "contraseña: ",
    "mot de passe : ",
    "пароль: ",
    "비밀번호: ",
    "senha: ",
    "令牌：",
    "トークン: ",
)


def bare_value(rule: Rule, sample: str) -> str:
    if rule.id in VALUE_OF:
        return VALUE_OF[rule.id](sample)
    if rule.secret_group == 0 or rule.id in SELF_IDENTIFYING or rule.id.endswith(BARE_SUFFIX):
        return sample
    m = confirm_regex(rule).search(sample.encode())
    assert m is not None, (rule.id, sample)
    return m.group(rule.secret_group).decode()


# ------------------------------------------------------------------------------ placements


def _chat(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Summarise the report."}]}
    doc.update(fields)
    return doc


def _tool_call(v: str) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"token": v})}}
    return _chat(
        messages=[
            {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    )


def _anthropic(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Summarise the report."}],
    }
    doc.update(fields)
    return doc


@dataclass(frozen=True)
class Placement:
    name: str
    carrier: str
    build: Callable[[str], dict[str, Any]]


PLACEMENTS: tuple[Placement, ...] = (
    Placement("tool-args", "openai.chat", _tool_call),
    Placement("user", "openai.chat", lambda v: _chat(user=v)),
    Placement("metadata-value", "openai.chat", lambda v: _chat(metadata={"note": v})),
    Placement("metadata-key", "openai.chat", lambda v: _chat(metadata={v: "1"})),
    Placement(
        "tool-description",
        "anthropic.messages",
        lambda v: _anthropic(
            tools=[
                {
                    "name": "lookup",
                    "description": f"Looks up an order. Uses {v} when called.",
                    "input_schema": {"type": "object"},
                }
            ]
        ),
    ),
    Placement("anthropic-user-id", "anthropic.messages", lambda v: _anthropic(metadata={"user_id": v})),
    *(
        Placement(
            "lang:" + name.strip(" :=："),
            "openai.chat",
            lambda v, n=name: _chat(messages=[{"role": "user", "content": n + v}]),
        )
        for name in FOREIGN
    ),
)

ENGINE = build_engine(
    secret_values=[],
    formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
    policy_version="t",
)


def inspect(placement: Placement, value: str) -> Verdict:
    raw = json.dumps(placement.build(value)).encode()
    parsed = CARRIERS[placement.carrier].parse_request(raw, CarrierLimits())
    return ENGINE.inspect(
        Subject(raw=raw, units=parsed.units, opaque=parsed.opaque, duplicate_keys=parsed.duplicate_keys)
    )


# ----------------------------------------------------------------------------- measurement


def samples_for(rule: Rule) -> list[str]:
    """Self-identifying values are found or not as a whole: two suffice. Name-context values,
    the ones a placement strips of their name: eight."""
    named = rule.secret_group != 0 and rule.id not in SELF_IDENTIFYING
    return ss.true_positives(rule.id, n=8 if named or rule.id.endswith(BARE_SUFFIX) else 2, seed=314)


#: A bare form covering at least this share of its parent's values makes the parent fully
#: bare-detectable; below it, the parent is (partly) context-only and must say why.
FULL_COVERAGE = 0.99


def bare_form(rule: Rule) -> Rule | None:
    return RULES.get(rule.id + BARE_SUFFIX)


def standalone_hit(rule: Rule, value: str) -> bool:
    """``rule`` reports ``value`` standing alone in a text unit."""
    return any(
        m.rule_id == rule.id for m in reference_scan(Catalogue("t", (rule,)), b"\x00" + value.encode() + b"\x00")
    )


@functools.cache
def coverage(rule_id: str) -> tuple[int, int]:
    """(values its bare form accepts, values) over 600 draws of the rule's own generator."""
    rule = RULES[rule_id]
    form = bare_form(rule)
    assert form is not None, rule_id
    values = [bare_value(rule, s) for s in ss.true_positives(rule_id, n=600, seed=27)]
    return sum(standalone_hit(form, v) for v in values), len(values)


@dataclass
class Result:
    checks: int = 0
    misses: collections.Counter[str] = field(default_factory=collections.Counter)  # placement -> count
    others: collections.Counter[str] = field(default_factory=collections.Counter)  # rules that caught a miss
    rejected: int = 0  # values the bare form's acceptance checks reject (its recall loss)

    @property
    def missed(self) -> int:
        return sum(self.misses.values())


@functools.cache
def measure() -> dict[str, Result]:
    results: dict[str, Result] = {}
    for rule in CAT.rules:
        wanted = {SECRET_FORMAT_PREFIX + rule.id, SECRET_FORMAT_PREFIX + rule.id + BARE_SUFFIX}
        form = bare_form(rule)
        res = results[rule.id] = Result()
        for sample in samples_for(rule):
            value = bare_value(rule, sample)
            if form is not None and not standalone_hit(form, value):
                res.rejected += 1
                continue
            for placement in PLACEMENTS:
                findings = inspect(placement, value).findings
                res.checks += 1
                if not {f.reason for f in findings} & wanted:
                    res.misses[placement.name] += 1
                    blocking = {f.reason for f in findings if not f.advisory}
                    res.others.update(r.removeprefix(SECRET_FORMAT_PREFIX) for r in blocking)
    return results


def partial() -> dict[str, float]:
    """Rules whose bare form covers less than FULL_COVERAGE of their values."""
    out = {}
    for form in BARE_RULES:
        found, total = coverage(parent(form).id)
        if found / total < FULL_COVERAGE:
            out[parent(form).id] = found / total
    return out


def table(results: dict[str, Result], ids: list[str]) -> str:
    lines = [
        f"{'rule':34} {'adv':3} {'missed':>8}  {'placements missed':30} {'bare cover':10} "
        f"{'caught instead by':18} context_only"
    ]
    for rid in ids:
        res, rule = results[rid], RULES[rid]
        where = "all" if len(res.misses) == len(PLACEMENTS) else ",".join(sorted(res.misses))
        cover = "-"
        if bare_form(rule) is not None:
            found, total = coverage(rid)
            cover = f"{found / total:.1%}"
        lines.append(
            f"{rid:34} {'yes' if rule.advisory else '':3} {res.missed:>3}/{res.checks:<4}  {where[:30]:30} "
            f"{cover:10} {','.join(sorted(res.others))[:18]:18} {rule.context_only or '-'}"
        )
    return "\n".join(lines)


def test_bare_values_in_every_placement_miss_only_where_documented() -> None:
    results = measure()
    missing = {rid for rid, res in results.items() if res.missed} | set(partial())
    documented = {r.id for r in CAT.rules if r.context_only}
    report = table(results, [r.id for r in CAT.rules if r.id in missing | documented])
    print("\nbare-credential misses (advisory rules count as found when they fire):\n" + report)
    assert missing == documented, (
        f"\nmissed but not documented context_only: {sorted(missing - documented)}"
        f"\ndocumented context_only but found everywhere now: {sorted(documented - missing)}\n{report}"
    )


def test_measurement_covers_every_rule_and_placement() -> None:
    results = measure()
    assert set(results) == set(RULES)
    for rid, res in results.items():
        assert res.checks == (len(samples_for(RULES[rid])) - res.rejected) * len(PLACEMENTS), rid
        assert res.checks > 0, rid
    assert len(PLACEMENTS) >= 17


def test_context_only_rules_are_name_context_rules() -> None:
    """Only a rule whose prefix is a name can be context-only; a -bare form never is."""
    for rule in CAT.rules:
        if rule.context_only:
            assert rule.secret_group != 0 and rule.id not in SELF_IDENTIFYING, rule.id
            assert not rule.id.endswith(BARE_SUFFIX), rule.id


def test_context_only_misses_are_the_name_context_rules_missing_everywhere_but_names() -> None:
    """A context-only rule misses in every placement that carries no name of its own: the
    misses are about the value, not about a field the engine fails to read."""
    results = measure()
    nameless = {"user", "metadata-value", "metadata-key", "tool-description", "anthropic-user-id"}
    for rule in CAT.rules:
        if rule.context_only and not any(r.id == rule.id + BARE_SUFFIX for r in BARE_RULES):
            assert nameless <= set(results[rule.id].misses), (rule.id, results[rule.id].misses)


# ------------------------------------------------------------------------------ bare forms


def parent(rule: Rule) -> Rule:
    return RULES[rule.id.removesuffix(BARE_SUFFIX)]


#: Recall of each bare form on its parent's values (random draws, unfiltered). The AWS form
#: requires a '/' or '+' (about 72% of keys have one): without it a 40-character key is a
#: random alphanumeric id, which the random-noise test rightly treats as benign.
RECALL_FLOOR = {"aws-secret-access-key-bare": 0.66}


def test_bare_forms_are_well_formed() -> None:
    assert BARE_RULES, "the catalogue has bare forms"
    for rule in BARE_RULES:
        base = parent(rule)
        assert base.secret_group != 0 and base.id not in SELF_IDENTIFYING, rule.id
        assert not rule.advisory and rule.validators, rule.id
        if rule.left == "lead":
            assert rule.pattern.startswith(catmod.LEAD), rule.id


@pytest.mark.parametrize("rule_id", [r.id for r in BARE_RULES])
def test_bare_form_recall_on_the_parent_values(rule_id: str) -> None:
    found, total = coverage(parent(RULES[rule_id]).id)
    floor = RECALL_FLOOR.get(rule_id, FULL_COVERAGE)
    print(f"\n{rule_id}: recall {found}/{total} = {found / total:.3f} (floor {floor})")
    assert found / total >= floor


def _bare_catalogue() -> Catalogue:
    return Catalogue(CAT.version, tuple(BARE_RULES))


def test_bare_forms_block_nothing_in_the_benign_corpus() -> None:
    cat = _bare_catalogue()
    for path in sorted(CORPUS.iterdir()):
        text = path.read_text(encoding="utf-8")
        for form in (text, json.dumps(text), json.dumps({"arguments": json.dumps({"text": text})})):
            data = form.encode()
            hits = [(h.rule_id, data[h.start : h.end]) for h in reference_scan(cat, data)]
            assert hits == [], (path.name, hits)


#: The look-alike bound. Every category must give zero matches, with one exception kept
#: deliberately adversarial: ``file-path-40`` is a synthetic worst case (every value exactly
#: 40 characters, no extension, camel-case words with digits in them), built to probe the AWS
#: form's path checks. There, at most 1 value in 1000 may match: at 10x this sample size it
#: measures about 1 in 4000, and real paths of that exact shape are themselves rare (a dot,
#: dash or underscore anywhere, or a length other than 40, already rules them out).
LOOKALIKE_BOUND = {"file-path-40": 0.001}


def test_bare_forms_on_realistic_lookalikes() -> None:
    cat = _bare_catalogue()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    sizes: dict[str, int] = {}
    examples: dict[tuple[str, str], str] = {}
    for name, values in lookalikes.categories(seed=2026, n=600).items():
        sizes[name] = len(values)
        for v in values:
            hit: set[str] = set()
            # alone in a unit, in prose, and in raw JSON
            for form in ("\x00" + v + "\x00", f"see {v} here", json.dumps({"v": v})):
                hit.update(h.rule_id for h in reference_scan(cat, form.encode()))
            for rid in hit:
                counts[(name, rid)] += 1
                examples.setdefault((name, rid), v)
    assert len(sizes) >= 40 and min(sizes.values()) >= 100, sizes
    print(f"\nlook-alikes: {sum(sizes.values())} values in {len(sizes)} categories; matches: {dict(counts) or 'none'}")
    for (name, rid), n in counts.items():
        bound = LOOKALIKE_BOUND.get(name, 0.0)
        assert n / sizes[name] <= bound, (name, rid, n, sizes[name], examples[(name, rid)])


def test_same_shape_values_are_reported_not_bounded() -> None:
    """Base64 of exactly 30 random bytes *is* an AWS secret key's distribution: the bare form
    matches it as often as it matches keys. Shown here so the number is visible, not hidden."""
    cat = _bare_catalogue()
    for name, values in lookalikes.same_shape(n=400).items():
        n = sum(bool(reference_scan(cat, b"\x00" + v.encode() + b"\x00")) for v in values)
        print(f"\n{name}: {n}/{len(values)} match a bare form")
        assert n <= len(values)


def test_random_noise_has_no_bare_matches() -> None:
    """The existing noise blobs, in more shapes: random alphanumeric runs of every length
    (40 included), hex runs of the lengths ids and digests come in (whole or shortened), and
    base64 lines of every usual width. (Random hex of exactly 37 characters is a Cloudflare
    global key's own shape, like base64 of 30 bytes for AWS: see the same-shape report.)"""
    r = random.Random(99)  # noqa: S311 - deterministic test data
    cat = _bare_catalogue()
    words = " ".join("".join(r.choice(ss.ALNUM) for _ in range(n)) for n in range(8, 70) for _ in range(40))
    lengths = (7, 8, 10, 12, 16, 20, 24, 26, 32, 40, 48, 56, 64, 96, 128)
    hexes = " ".join(r.randbytes(64).hex()[:n] for n in lengths for _ in range(100))
    lines = "\n".join(base64.b64encode(r.randbytes(n)).decode() for n in (33, 45, 48, 57, 60, 96) for _ in range(60))
    for blob in (words, hexes, lines):
        assert reference_scan(cat, blob.encode(), include_advisory=False) == []


# ------------------------------------------------------------------------ lead boundaries


def test_lead_rules_report_one_candidate_per_run() -> None:
    """Without a literal anchor a bare pattern would make Hyperscan report every offset of a
    long base64 run (and exhaust the match cap); the lead keeps it to one per run start."""
    rule = RULES["aws-secret-access-key-bare"]
    r = random.Random(5)  # noqa: S311 - deterministic test data
    blob = base64.b64encode(r.randbytes(60_000)).decode()
    wrapped = "\n".join(blob[i : i + 76] for i in range(0, len(blob), 76))

    def events(pattern: str, data: bytes) -> int:
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=[pattern.encode()], ids=[0], elements=1, flags=[0])
        ends: list[int] = []
        db.scan(data, match_event_handler=lambda _i, _f, to, _fl, _c: ends.append(to))
        return len(ends)

    for data, limit in ((blob.encode(), 1), (wrapped.encode(), wrapped.count("\n") + 1)):
        assert events(rule.pattern, data) <= limit
        assert events(rule.pattern.removeprefix(catmod.LEAD), data) > 30_000  # what the lead avoids


def test_lead_rules_report_the_value_and_its_field() -> None:
    rule = RULES["aws-secret-access-key-bare"]
    value = ss.true_positives(rule.id, n=1, seed=1)[0]
    data = b'{"a": "x", "b": "' + value.encode() + b'"}'
    [m] = reference_scan(Catalogue("t", (rule,)), data)
    assert (m.start, m.end) == (data.index(value.encode()), data.index(value.encode()) + 40)
    assert reference_scan(Catalogue("t", (rule,)), value.encode()) == []  # no neighbour: not seen
    for placement in PLACEMENTS[:4]:
        findings = [f for f in inspect(placement, value).findings if f.reason.endswith(rule.id)]
        pointers = {f.pointer for f in findings} - {None}
        expected = {
            "user": "/user",
            "metadata-value": "/metadata/note",
            "metadata-key": "/metadata",
            "tool-args": "/messages/1/tool_calls/0/function/arguments",
        }[placement.name]
        assert pointers == {expected}, (placement.name, pointers)


# ------------------------------------------------------------------------------ validators


def test_validators() -> None:
    v = catmod.VALIDATORS
    assert v["mixed_classes"](b"aB3") and not v["mixed_classes"](b"ab3") and not v["mixed_classes"](b"aBc")
    assert v["letter_and_digit"](b"a3") and not v["letter_and_digit"](b"333") and not v["letter_and_digit"](b"abc")
    assert v["has_symbol"](b"ab/c") and v["has_symbol"](b"a-b") and not v["has_symbol"](b"aB3")
    assert v["class_changes"](b"a1B2c3D4") and not v["class_changes"](b"abcdefgh12")
    assert v["not_path"](b"a/b/c/d") and not v["not_path"](b"a/b/c/d/e")
    snowflake = base64.urlsafe_b64encode(b"1234567890123456789").rstrip(b"=")
    assert v["discord_snowflake"](snowflake + b".AbCdEf." + b"x" * 27)
    for first in (b"123456789012345", b"0123456789012345678", b"123456789012345678901", b"12345678901234567x"):
        assert not v["discord_snowflake"](base64.urlsafe_b64encode(first).rstrip(b"=") + b".AbCdEf.x")
    assert not v["discord_snowflake"](b"M!!.x")
    assert not v["discord_snowflake"](snowflake[:-1] + b"z.AbCdEf.x")  # not the canonical encoding


def test_unknown_validator_is_rejected_at_load() -> None:
    doc = {
        "version": "1",
        "rules": [
            {"id": "x-rule", "description": "x", "keywords": ["abc"], "pattern": "abc[0-9]{4}", "validators": ["luhn"]}
        ],
    }
    with pytest.raises(catmod.CatalogueError, match="'x-rule': unknown validators \\['luhn'\\]"):
        load_catalogue(json.dumps(doc).encode())
    doc["rules"][0]["validators"] = ["mixed_classes"]
    doc["rules"][0]["context_only"] = "a reason"
    rule = load_catalogue(json.dumps(doc).encode()).rules[0]
    assert rule.validators == ("mixed_classes",) and rule.context_only == "a reason"


def test_lead_rules_see_values_whatever_the_json_escaping() -> None:
    """A client that escapes '/' (PHP's json_encode) or writes \\uXXXX splits the value in the
    raw bytes; the decoded unit still follows a separator, so the value is seen there. As the
    first key of the whole document, the raw bytes' quote is its neighbour."""
    value = next(v for v in ss.true_positives("aws-secret-access-key-bare", n=50, seed=2) if "/" in v)
    reason = SECRET_FORMAT_PREFIX + "aws-secret-access-key-bare"
    escaped = json.dumps(value).replace("/", "\\/")[1:-1]
    u_escaped = "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(escaped))
    for text in (escaped, u_escaped):
        for body, filler in (
            ('{"model": "gpt-4.1", "user": "@", "messages": [{"role": "user", "content": "hi"}]}', text),
            ('{"model": "gpt-4.1", "messages": [{"role": "user", "content": "@"}]}', text),
            ('{"@": 1, "model": "gpt-4.1", "messages": []}', value),
        ):
            raw = body.replace("@", filler).encode()
            parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
            verdict = ENGINE.inspect(Subject(raw=raw, units=parsed.units))
            assert reason in {f.reason for f in verdict.findings}, raw
