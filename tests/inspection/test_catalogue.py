"""Recall, precision and engine parity of the built-in credential catalogue."""

from __future__ import annotations

import base64
import json
import pathlib
import random
import re
from collections.abc import Iterable

import hyperscan
import pytest

from gateway.inspection import catalogue as catmod
from gateway.inspection.catalogue import (
    Catalogue,
    CatalogueError,
    FormatMatch,
    Rule,
    accept,
    confirm_in_window,
    confirm_regex,
    load_catalogue,
    reference_scan,
    shannon_entropy,
)

from . import secret_samples as ss

CAT = load_catalogue()
RULES: dict[str, Rule] = {r.id: r for r in CAT.rules}
RULE_IDS = [r.id for r in CAT.rules]
CORPUS = pathlib.Path(__file__).with_name("benign_corpus")

#: Contexts for (b): prose with spaces / punctuation / non-ASCII around the secret.
PROSE = (
    "Here is the credential: {s} — please keep it private.",
    "token=({s}), then retry",
    "«{s}»",
    "Use `{s}`!",
    "It is {s}. Next sentence.",
    "[{s}]",
    "'{s}';",
    "<code>{s}</code>",
    "\t{s}\n",
    "密钥是：{s}。请勿外传",
)

#: Raw JSON-escaped forms that are allowed NOT to match, with the reason. Empty: every rule's
#: samples are found in the raw escaped bytes too (secrets containing newlines are matched
#: because PEM/PPK bodies accept ``\\n`` escapes; Python's json does not escape ``/``).
RAW_ESCAPE_EXEMPT: dict[str, str] = {}

_OVERHANG = set(b".,;:!?=-_~'\")]}")


def only(rule: Rule) -> Catalogue:
    return Catalogue(CAT.version, (rule,))


def _covered(rule: Rule, matches: Iterable[FormatMatch], data: bytes, needle: bytes) -> bool:
    """A match of ``rule`` lies on the (single) occurrence of ``needle`` in ``data``."""
    ns = data.find(needle)
    assert ns >= 0, (needle, data)
    ne = ns + len(needle)
    exact = rule.secret_group == 0 and rule.left != "none" and rule.right != "none"
    for m in matches:
        # a match starts on the secret, or (a name-context rule) on a name right before it
        # that now counts as one, e.g. 密钥是：SECRET=... (one match per end is reported)
        before = not exact and m.start < ns and m.end >= ne
        if m.rule_id != rule.id or not (ns <= m.start < ne or before):
            continue
        if any(b not in _OVERHANG for b in data[ne : m.end]):
            continue  # ran past the secret into the surrounding text
        if exact and (m.start != ns or m.end < ne):
            continue
        text = data[m.start : m.end].lower()
        assert any(k.encode() in text for k in rule.keywords), (rule.id, text)
        return True
    return False


def standalone(rule: Rule, data: bytes) -> bytes:
    """``data`` as the engine sees a value that stands alone. A ``lead`` rule (a bare form with
    no literal anchor) needs a left neighbour: in the engine every value has one (raw JSON
    starts with ``{``; each text unit but the first, a top-level key, follows a NUL separator)."""
    return b"\x00" + data if rule.left == "lead" else data


def assert_found(rule: Rule, data: bytes, needle: bytes, what: str) -> None:
    matches = reference_scan(only(rule), data)
    assert _covered(rule, matches, data, needle), f"{rule.id}: {what}: {data[:300]!r}"


# ------------------------------------------------------------------------------------ schema


def test_rule_count_ids_and_descriptions() -> None:
    assert len(CAT.rules) >= 110
    assert len(set(RULE_IDS)) == len(RULE_IDS)
    for rule in CAT.rules:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{2,62}", rule.id)
        assert rule.description and "\n" not in rule.description
        assert rule.keywords and all(k == k.lower() for k in rule.keywords)
        assert rule.left in {"word", "token", "none", "lead"} and rule.right in {"word", "token", "none"}
        assert rule.min_entropy is not None, f"{rule.id}: every rule has a random part"


def test_advisory_rules_are_few_and_generic() -> None:
    advisory = [r.id for r in CAT.rules if r.advisory]
    assert 1 <= len(advisory) <= 4
    assert all(rid.startswith("generic-") for rid in advisory)
    assert all(RULES[rid].advisory for rid in RULE_IDS if rid.startswith("generic-"))


def test_packaged_catalogue_loads_the_same_from_bytes() -> None:
    data = (pathlib.Path(catmod.__file__).with_name("catalogue.json")).read_bytes()
    assert load_catalogue(data) == CAT
    assert CAT.version


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_pattern_compiles_everywhere_and_is_bounded(rule_id: str) -> None:
    rule = RULES[rule_id]
    pattern = rule.pattern.encode("ascii")
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[pattern], ids=[0], elements=1, flags=[0])
    body = pattern[4:] if pattern.startswith(b"(?i)") else pattern
    assert b"(?" not in body.replace(b"(?:", b""), "only a leading (?i) flag is allowed"
    compiled = re.compile(pattern)
    lo, hi = re._parser.parse(pattern).getwidth()  # type: ignore[attr-defined]
    assert lo >= 1 and hi <= 4096 and hi == rule.max_width
    assert compiled.search(b"") is None
    assert confirm_regex(rule).search(b"") is None
    assert 0 <= rule.secret_group <= compiled.groups


def test_all_patterns_compile_into_one_hyperscan_database(hs_db: hyperscan.Database) -> None:
    assert hs_db is not None


@pytest.mark.parametrize("rule_id", [r.id for r in CAT.rules if r.allow])
def test_allow_list_entries_are_real_near_matches(rule_id: str) -> None:
    """Allowed examples have the rule's shape (otherwise the allow entry would be dead)."""
    rule = RULES[rule_id]
    if rule.secret_group != 0:
        return
    for example in rule.allow:
        m = confirm_regex(rule).fullmatch(example.encode())
        assert m is not None, example
        assert not accept(rule, m)
        assert reference_scan(only(rule), f"key: {example}.".encode()) == []


def _bad(rule: dict[str, object]) -> bytes:
    base: dict[str, object] = {
        "id": "bad-rule",
        "description": "x",
        "keywords": ["abc"],
        "pattern": "abc[0-9]{4}",
    }
    base.update(rule)
    return json.dumps({"version": "1", "rules": [base]}).encode()


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ({"pattern": "abc(?=x)[0-9]{4}"}, "look-around"),
        ({"pattern": "abc(?<!x)[0-9]{4}"}, "look-around"),
        ({"pattern": r"\babc[0-9]{4}"}, "anchors"),
        ({"pattern": "^abc[0-9]{4}"}, "anchors"),
        ({"pattern": r"(abc)\1"}, "back-references"),
        ({"pattern": "(?P<x>abc)[0-9]{4}"}, "named groups"),
        ({"pattern": "abc[0-9]+"}, "unbounded"),
        ({"pattern": "abc[0-9]*"}, "unbounded"),
        ({"pattern": "abc[0-9]{4,}"}, "unbounded"),
        ({"pattern": "abc[0-9]{4,9}?"}, "lazy"),
        ({"pattern": "abc.{4}"}, "'.'"),
        ({"pattern": "(?s)abc[0-9]{4}"}, "inline flag"),
        ({"pattern": "abc(?i:x)[0-9]{4}"}, "scoped inline flags"),
        ({"pattern": "(?:abc)?[0-9]{0,4}"}, "empty string"),
        ({"pattern": "abc[0-9]{4097}"}, "width"),
        ({"pattern": "abc[0-9"}, "does not compile"),
        ({"pattern": "abc\u00e9"}, "ASCII"),
        ({"id": "Bad_Rule"}, "id must match"),
        ({"keywords": ["ABC"]}, "lowercase"),
        ({"keywords": ["\u041f\u0430\u0440\u043e\u043b\u044c"]}, "lowercase"),
        ({"keywords": ["a\nb"]}, "printable"),
        ({"validators": ["entropy_plus"]}, "unknown validators"),
        ({"validators": "mixed_classes"}, "validators must be a list"),
        ({"validators": ["mixed_classes", "mixed_classes"]}, "must not repeat"),
        ({"context_only": ""}, "context_only"),
        ({"context_only": "two\nlines"}, "context_only"),
        ({"context_only": True}, "context_only"),
        ({"left": "lead", "pattern": "abc([0-9]{4})", "secret_group": 1}, "catalogue.LEAD"),
        ({"left": "lead", "pattern": catmod.LEAD + "abc[0-9]{4}"}, "secret_group must be >= 1"),
        ({"right": "lead"}, "left/right"),
        ({"keywords": []}, "keywords"),
        ({"secret_group": 1}, "secret_group"),
        ({"left": "line"}, "left/right"),
        ({"min_entropy": "high"}, "min_entropy"),
        ({"advisory": "no"}, "advisory"),
        ({"allow": "AKIA"}, "allow"),
        ({"colour": "red"}, "unknown keys"),
        ({"description": "two\nlines"}, "description"),
    ],
)
def test_validation_rejects_bad_rules(override: dict[str, object], problem: str) -> None:
    with pytest.raises(CatalogueError) as info:
        load_catalogue(_bad(override))
    message = str(info.value)
    assert problem in message
    assert "bad-rule" in message or "Bad_Rule" in message


def test_validation_rejects_bad_documents() -> None:
    good = json.loads(_bad({}))
    dup = {"version": "1", "rules": [good["rules"][0], good["rules"][0]]}
    with pytest.raises(CatalogueError, match="'bad-rule': duplicate id"):
        load_catalogue(json.dumps(dup).encode())
    for doc in (b"[]", b"{", b'{"version": "1", "rules": []}', b'{"rules": [{}]}'):
        with pytest.raises(CatalogueError):
            load_catalogue(doc)
    assert isinstance(CatalogueError("x"), ValueError)


def test_shannon_entropy() -> None:
    assert shannon_entropy(b"") == 0.0
    assert shannon_entropy(b"aaaa") == 0.0
    assert shannon_entropy(b"ab") == pytest.approx(1.0)
    assert shannon_entropy(bytes(range(256))) == pytest.approx(8.0)
    assert shannon_entropy(b"AKIAIOSFODNN7EXAMPLE") > 3.0


# -------------------------------------------------------------------------- true positives


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_true_positives_in_every_context(rule_id: str) -> None:
    rule = RULES[rule_id]
    samples = ss.true_positives(rule_id, n=50, seed=20261101)
    assert len(set(samples)) == 50
    assert samples == ss.true_positives(rule_id, n=50, seed=20261101)  # deterministic
    for s in samples:
        assert any(k in s.lower() for k in rule.keywords), (rule_id, s)
        raw = s.encode()
        # (a) alone
        assert_found(rule, standalone(rule, raw), raw, "alone")
        # (b) prose
        for ctx in PROSE:
            assert_found(rule, ctx.format(s=s).encode(), raw, f"prose {ctx!r}")
        esc1 = json.dumps(s)[1:-1].encode()
        esc2 = json.dumps(json.dumps(s)[1:-1])[1:-1].encode()
        # (c) inside a JSON string value
        doc_c = json.dumps({"content": "key: " + s})
        # (d) right after an escaped newline
        doc_d = json.dumps("line1\n" + s)
        # (e) doubly escaped, as OpenAI tool-call arguments
        doc_e = json.dumps({"arguments": json.dumps({"k": s})})
        if rule_id not in RAW_ESCAPE_EXEMPT:
            assert_found(rule, doc_c.encode(), esc1, "raw JSON string")
            assert_found(rule, doc_d.encode(), esc1, "raw JSON after \\n")
            assert_found(rule, doc_e.encode(), esc2, "raw doubly escaped JSON")
        # the engine also scans decoded strings
        assert_found(rule, json.loads(doc_c)["content"].encode(), raw, "decoded (c)")
        assert_found(rule, json.loads(doc_d).encode(), raw, "decoded (d)")
        inner = json.loads(json.loads(doc_e)["arguments"])["k"]
        assert_found(rule, standalone(rule, inner.encode()), raw, "decoded twice (e)")


# ------------------------------------------------------------------------- false positives


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_false_positives_do_not_fire(rule_id: str) -> None:
    rule = RULES[rule_id]
    near_misses = ss.false_positives(rule_id)
    assert len(near_misses) >= 3
    for fp in near_misses:
        for data in (fp, f"see {fp} here", json.dumps({"content": fp})):
            hits = reference_scan(only(rule), data.encode())
            assert hits == [], f"{rule_id} fired on near-miss {data!r}: {hits}"


def _corpus_texts() -> list[tuple[str, str]]:
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted(CORPUS.iterdir())]


def test_benign_corpus_has_no_blocking_matches() -> None:
    texts = _corpus_texts()
    assert len(texts) >= 12
    for name, text in texts:
        forms = {
            "raw": text,
            "json": json.dumps(text),
            "chat": json.dumps({"messages": [{"role": "user", "content": text}]}),
            "tool-args": json.dumps({"arguments": json.dumps({"text": text})}),
        }
        for form, data in forms.items():
            hits = reference_scan(CAT, data.encode(), include_advisory=False)
            found = [(h.rule_id, data.encode()[h.start : h.end][:80]) for h in hits]
            assert hits == [], f"{name} ({form}): {found}"


def test_random_noise_has_no_blocking_matches() -> None:
    r = random.Random(4242)  # noqa: S311 - deterministic test data

    def wrap(s: str, n: int) -> str:
        return "\n".join(s[i : i + n] for i in range(0, len(s), n))

    blobs = [
        wrap(base64.b64encode(r.randbytes(150_000)).decode(), 76),
        base64.urlsafe_b64encode(r.randbytes(150_000)).decode(),
        wrap(r.randbytes(100_000).hex(), 64),
        " ".join("".join(r.choice(ss.ALNUM) for _ in range(r.randint(8, 60))) for _ in range(4000)),
    ]
    for blob in blobs:
        assert reference_scan(CAT, blob.encode(), include_advisory=False) == []


# ------------------------------------------------------------------------------ boundaries


def _sample(rule_id: str, i: int = 0) -> bytes:
    return ss.true_positives(rule_id, n=3, seed=99)[i].encode()


def _ids(data: bytes) -> set[str]:
    return {m.rule_id for m in reference_scan(CAT, data)}


@pytest.mark.parametrize(
    "rule_id",
    [
        "aws-access-key-id",
        "github-pat",
        "stripe-live-secret-key",
        "jwt",
        "sendgrid-api-key",
        "anthropic-api-key",
    ],
)
def test_json_text_boundary_rule(rule_id: str) -> None:
    s = _sample(rule_id)
    # left: the letter of a JSON escape is not a neighbour
    for before in (b"\\n", b"\\r", b"\\t", b"\\b", b"\\f", b'\\"', b"\\/", b"\\\\", b"\\u00e9"):
        data = b'{"a": "x' + before + s + b'"}'
        assert rule_id in _ids(data), data
    # right: a backslash starts an escape, so it ends the secret
    for after in (b"\\n", b'\\"', b"\\u00e9", b"\\\\"):
        data = b'{"a": "' + s + after + b'y"}'
        assert rule_id in _ids(data), data
    # a plain letter is still a neighbour (no backslash before it)
    for before in (b"n", b"x", b"u00e9", b"1"):
        assert rule_id not in _ids(b"key " + before + s), before


def test_match_never_starts_on_the_letter_of_an_escape() -> None:
    npm = _sample("npm-access-token")
    assert "npm-access-token" in _ids(b'"x\\n' + npm + b'"')  # newline, then the token
    assert "npm-access-token" not in _ids(b'"x\\' + npm[1:] + b'"')  # newline, then "pm_..."
    assert "npm-access-token" in _ids(b'"C:\\\\' + npm + b'"')  # escaped backslash
    dd = b"DD_API_KEY=" + b"3f9c2a7b1e4d8c6a0b5f9e2d7c1a4b8e"
    hits = [h for h in reference_scan(CAT, b'"a\\n' + dd + b'"') if h.rule_id == "datadog-api-key"]
    assert [(h.start, h.end) for h in hits] == [(4, 4 + len(dd))]


def test_prefix_inside_a_longer_identifier_does_not_fire() -> None:
    cases = {
        "aws-access-key-id": b"x",
        "stripe-live-secret-key": b"my",
        "github-pat": b"_",
        "openai-project-key": b"a",
        "slack-bot-token": b"9",
        "google-api-key": b"Z",
        "npm-access-token": b"pnpm",
        "huggingface-access-token": b"s",
    }
    for rule_id, glue in cases.items():
        s = _sample(rule_id)
        assert rule_id in _ids(b"k " + s + b" k")
        assert rule_id not in _ids(b"k " + glue + s + b" k"), (rule_id, glue)
        if RULES[rule_id].max_width == len(s):  # fixed width: one more char breaks it
            assert rule_id not in _ids(b"k " + s + b"Q9 k"), rule_id
    # every prefix-anchored word/token rule ignores a sample glued to a preceding letter
    for rule in CAT.rules:
        if rule.left == "none" or rule.secret_group != 0 or rule.pattern.startswith("(?i)"):
            continue
        for s in ss.true_positives(rule.id, n=5, seed=3):
            hits = reference_scan(only(rule), b"Q" + s.encode())
            assert not [h for h in hits if h.start <= 1], (rule.id, s)


def test_token_boundaries() -> None:
    jwt = _sample("jwt")
    assert "jwt" in _ids(b"TOKEN=" + jwt)  # '=' on the left is an assignment
    assert "jwt" in _ids(b"Authorization: Bearer " + jwt + b". Done")  # full stop ends it
    assert "jwt" not in _ids(b"abc." + jwt)  # inside a dotted token
    assert "jwt" not in _ids(b"abc/" + jwt)  # inside a base64 blob / path
    assert "jwt" not in _ids(jwt + b".more")
    assert "jwt" not in _ids(jwt + b"+more")


def test_placeholders_and_templates_are_rejected() -> None:
    for text in (
        b"STRIPE=sk_live_XXXXXXXXXXXXXXXXXXXXXXXX",
        b"ghp_EXAMPLEexampleEXAMPLEexample123456",
        b"postgres://user:${DB_PASSWORD}@db/app",
        b"postgres://app:$PGPASSWORD@db/app",
        b"postgres://user:password@localhost/db",
        b"AKIA1234567890ABCDEF",
        b"glpat-<your-token-here>xxxxxxxxxxxx",
        b"git clone https://user:PERSONAL_ACCESS_TOKEN@github.com/org/repo.git",
        b"git clone https://oauth2:your-access-token@gitlab.com/org/repo.git",
        b"mongodb://admin:mongo_admin_password@db/app",
        b"Authorization: Basic ${BASIC_CREDENTIALS}",
    ):
        assert reference_scan(CAT, text, include_advisory=False) == [], text


def test_reference_scan_orders_and_reports_overlaps() -> None:
    url = b"postgres://app:" + b"Zq8vN2xLp4Rt7WmK" + b"@db.internal/app"
    data = b"first " + url + b" then " + _sample("aws-access-key-id")
    hits = reference_scan(CAT, data)
    ids = [h.rule_id for h in hits]
    assert "postgres-connection-uri" in ids and "url-embedded-credentials" in ids
    assert hits == sorted(hits, key=lambda h: (h.start, h.rule_id, h.end))
    assert reference_scan(CAT, b"") == []
    generic = b'api_key = "' + b"Zq8vN2xLp4Rt7WmKa9B3cD5eF7gH" + b'"'
    assert "generic-api-key" in _ids(generic)
    assert reference_scan(CAT, generic, include_advisory=False) == []


# ------------------------------------------------------------------ Hyperscan parity


@pytest.fixture(scope="module")
def hs_db() -> hyperscan.Database:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    patterns = [r.pattern.encode("ascii") for r in CAT.rules]
    db.compile(
        expressions=patterns,
        ids=list(range(len(patterns))),
        elements=len(patterns),
        flags=[0] * len(patterns),
    )
    return db


def _hyperscan_confirmed(db: hyperscan.Database, data: bytes) -> list[FormatMatch]:
    reported: set[tuple[int, int]] = set()

    def on_match(rule_index: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
        reported.add((rule_index, to))

    db.scan(data, match_event_handler=on_match)
    out: set[FormatMatch] = set()
    for rule_index, end in reported:
        out.update(confirm_in_window(CAT.rules[rule_index], data, end))
    return sorted(out, key=lambda h: (h.start, h.rule_id, h.end))


def _parity_documents() -> list[bytes]:
    r = random.Random(7)  # noqa: S311 - deterministic test data
    docs: list[bytes] = []
    # every rule, two samples, in assorted contexts, as one large document
    parts: list[str] = []
    for rule_id in RULE_IDS:
        for s in ss.true_positives(rule_id, n=2, seed=5):
            form = r.randrange(4)
            if form == 0:
                parts.append(r.choice(PROSE).format(s=s))
            elif form == 1:
                parts.append(json.dumps({"content": "key: " + s}))
            elif form == 2:
                parts.append(json.dumps({"arguments": json.dumps({"k": s})}))
            else:
                parts.append(s)
    docs.append("\n".join(parts).encode())
    # the same secrets glued together with no separator, and the near-misses
    glued = "".join(ss.true_positives(rid, n=1, seed=6)[0] for rid in RULE_IDS)
    docs.append(glued.encode())
    docs.append("\n".join(fp for rid in RULE_IDS for fp in ss.false_positives(rid)).encode())
    # benign corpus, raw and escaped
    for _name, text in _corpus_texts():
        docs.append(text.encode())
        docs.append(json.dumps({"content": text}).encode())
    # adversarial fuzz: keyword fragments, random runs and separators spliced together
    fragments = [k for rule in CAT.rules for k in rule.keywords] + [
        "-----BEGIN RSA PRIVATE KEY-----",
        "AKIA",
        "ghp_",
        "eyJ",
        "sk-proj-",
        "xoxb-",
        "://",
        "postgres://",
        "@",
        ":",
        "=",
        '"',
        "\\n",
        '\\"',
        "\\\\",
        "\\/",
        ".",
        "-",
        "_",
        " ",
        "\n",
        "DD_API_KEY=",
        "password=",
        "Authorization: Bearer ",
        "AccountKey=",
        "AAAAAAAAAAAAAAAAAAAAA",
    ]
    alphabets = [ss.ALNUM, ss.HEX, ss.B64, ss.B64URL, ss.UPPER_ALNUM, ss.DIGITS]
    for _ in range(12):
        chunks: list[str] = []
        for _ in range(r.randint(200, 400)):
            if r.random() < 0.45:
                chunks.append(r.choice(fragments))
            else:
                alphabet = r.choice(alphabets)
                chunks.append("".join(r.choice(alphabet) for _ in range(r.choice((4, 16, 24, 32, 36, 40, 64, 100)))))
        docs.append("".join(chunks).encode())
    # overlapping / repeated shapes
    s = ss.true_positives("github-pat", n=1, seed=8)[0]
    docs.append(("ghp_" + s + s + " " + s[:20] + s).encode())
    return docs


def test_hyperscan_windowed_confirmation_equals_reference(hs_db: hyperscan.Database) -> None:
    for data in _parity_documents():
        expected = reference_scan(CAT, data)
        got = _hyperscan_confirmed(hs_db, data)
        missing = set(expected) - set(got)
        extra = set(got) - set(expected)
        assert not missing and not extra, (sorted(missing, key=str)[:5], sorted(extra, key=str)[:5])
        assert got == expected


def test_confirm_in_window_edges() -> None:
    rule = RULES["github-pat"]
    s = _sample("github-pat")
    data = b"ab " + s + b" cd"
    end = 3 + len(s)
    assert confirm_in_window(rule, data, end) == [FormatMatch("github-pat", 3, end)]
    assert confirm_in_window(rule, data, end - 1) == []
    assert confirm_in_window(rule, data, 0) == []
    assert confirm_in_window(rule, data, len(data) + 5) == []
    # a match at the very start / end of the buffer
    assert confirm_in_window(rule, s, len(s)) == [FormatMatch("github-pat", 0, len(s))]
