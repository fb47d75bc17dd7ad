"""Built-in catalogue of well-known credential formats, and its reference matcher.

This module owns:

* loading and validating ``catalogue.json`` (the data file shipped next to this module,
  read through :mod:`importlib.resources`) into immutable :class:`Rule` objects;
* the *confirmation regex* of a rule (:func:`confirm_regex`): the rule's Hyperscan-compatible
  ``pattern`` wrapped in boundary look-arounds that Hyperscan cannot express;
* the acceptance test of a candidate (:func:`accept`): allow-list of published example keys,
  placeholder markers, a Shannon-entropy floor and the rule's named :data:`VALIDATORS`, all
  applied to the rule's secret part;
* the reference (slow fallback) matcher :func:`reference_scan`, and
  :func:`confirm_in_window`, the exact same confirmation logic restricted to the window around
  one Hyperscan-reported match end. Both produce identical results (the test suite proves
  it), so the catalogue's recall and precision do not depend on which engine runs.

It is pure: no I/O other than reading the packaged data file, no clock, no randomness and no
module-level mutable state except the ``functools.lru_cache`` of compiled regexes.

Match semantics (shared by both engines)
----------------------------------------
For every rule and every start offset ``s``, the *candidate at s* is the match Python's
``re`` prefers when matching the confirmation regex at ``s`` (greedy, leftmost alternative),
evaluated against the whole buffer. A candidate is kept when :func:`accept` passes. When
several kept candidates of one rule end at the same offset, only the one with the smallest
start is reported. Unlike plain ``finditer``, candidates of one rule may overlap; this is what
makes the result independent of where scanning started, and therefore reproducible from a
window around a single match end.

Boundaries
----------
``word``  the neighbouring byte is not ``[A-Za-z0-9_]``.
``token`` for base64-ish / JWT-ish bodies. Left: the previous byte is not ``[A-Za-z0-9_+/.-]``
          (``=`` is accepted on the left: it is the assignment in ``TOKEN=eyJ...`` and base64
          padding never precedes data). Right: the next byte is not ``[A-Za-z0-9_+/=-]``, and
          not a ``.`` followed by such a byte (so a sentence-ending full stop is fine).
``none``  self-delimiting patterns (PEM headers, URLs).
``lead``  (left only) for *bare* forms that have no literal anchor, such as a 40-character
          AWS secret key standing alone: a pattern made only of a character run would make
          Hyperscan report a candidate at every offset of a long base64 or hex blob (and hit
          the match cap). Such a pattern starts with :data:`LEAD`, which consumes the left
          neighbour itself (any byte that is not ``[A-Za-z0-9_+/.-]`` or a backslash, or a
          whole JSON escape ``\\n``, ``\\"``, ``\\uXXXX``...), so a run yields one candidate.
          The reported match starts at the secret group, never on the neighbour. A value at
          the very start of a buffer has no neighbour and is not seen. In the engine that is
          at most the first text unit (a top-level key), and the raw JSON, scanned too, has a
          quote before it: every other unit, header values included, follows a separator.

JSON text rule: the engine also scans raw JSON bytes, so on the left a byte that is the
letter of a JSON escape (``\\n \\r \\t \\b \\f \\" \\/ \\\\`` or the last hex digit of
``\\uXXXX``) does not count as a neighbour, and conversely a match never starts *on* the
letter of an escape (``\\npm_...`` is a newline followed by ``pm_...``, not an npm token); on
the right, ``\\`` (start of an escape) is never part of a word or token, so it always ends one.

Validators: a rule may name acceptance checks that a regular expression cannot express, from
the closed set :data:`VALIDATORS` (mixed character classes, a decoded Discord snowflake...).
They run in :func:`accept`, so both engines apply them identically.

Context-only: a rule whose value, standing alone, cannot be told from ordinary data (a bare
32-hex Datadog key is a trace id) says so in ``context_only``, a one-line reason. It is
documentation (the bare-credential test checks it against what the engine measures); it does
not change matching.

Placeholders: besides the per-rule ``allow`` list (exact secret-part matches), a secret part is
rejected when it contains one of :data:`PLACEHOLDER_MARKERS` (case-insensitive), is a bare
``$VAR`` / ``%VAR%`` environment reference, or is a variable-like name (``ACCESS_TOKEN``,
``your-access-token``). The markers are long enough, and random keys mix enough character
classes, that a real key is rejected this way with negligible probability.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib
import importlib.resources
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "BOUNDARY_KINDS",
    "LEAD",
    "MAX_PATTERN_WIDTH",
    "PLACEHOLDER_MARKERS",
    "VALIDATORS",
    "Catalogue",
    "CatalogueError",
    "FormatMatch",
    "Rule",
    "accept",
    "confirm_in_window",
    "confirm_regex",
    "load_catalogue",
    "reference_scan",
    "shannon_entropy",
]

MAX_PATTERN_WIDTH = 4096
BOUNDARY_KINDS = frozenset({"word", "token", "none"})
LEFT_ONLY_KINDS = frozenset({"lead"})
#: The left neighbour of a bare value, consumed by the pattern (see ``lead`` above): a byte
#: that is neither tokenish (``[A-Za-z0-9_+/.-]``) nor a backslash, or a whole JSON escape.
LEAD = r'(?:[^A-Za-z0-9_+/.\\-]|\\[nrtbf"/\\]|\\u[0-9A-Fa-f]{4})'

#: Case-insensitive substrings that mark a secret part as a documentation placeholder.
PLACEHOLDER_MARKERS: tuple[str, ...] = (
    "example",
    "xxxxxx",
    "******",
    "placeholder",
    "your_",
    "your-",
    "yourpass",
    "yourkey",
    "changeme",
    "change_me",
    "replace_me",
    "replaceme",
    "redacted",
    "password",
    "process.env",
    "os.environ",
    "getenv",
    "12345678",
    "abcdefgh",
    "${",
    "{{",
    "}}",
    "<",
    ">",
)

_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{2,62}")
_ENV_REF_RE = re.compile(rb"\$[A-Za-z_][A-Za-z0-9_]*|%[A-Za-z_][A-Za-z0-9_]*%")
# A variable name standing in for a value: PERSONAL_ACCESS_TOKEN, your-access-token.
_IDENTIFIER_RE = re.compile(rb"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z]+(?:[_-][a-z]+)+")
_RULE_KEYS = frozenset(
    {
        "id",
        "description",
        "keywords",
        "pattern",
        "secret_group",
        "min_entropy",
        "allow",
        "left",
        "right",
        "advisory",
        "validators",
        "context_only",
    }
)
_REQUIRED_KEYS = frozenset({"id", "description", "keywords", "pattern"})

# Byte classes used by the boundary look-arounds.
_WORD = r"[A-Za-z0-9_]"
_TOKENISH_LEFT_BYTES = r"[A-Za-z0-9_+/.-]"
_TOKENISH_RIGHT_BYTES = r"[A-Za-z0-9_+/=-]"


def _left(neighbour: str) -> str:
    """Left boundary: no ``neighbour`` byte before the match, JSON escapes understood."""
    return (
        r"(?-i:(?<!" + neighbour + r")(?<!\\)"  # an ordinary non-neighbour byte (or start)
        r'|(?<=\\[nrtbf"/\\])'  # right after a whole JSON escape: \n \r \t \b \f \" \/ \\
        r"|(?<=\\u[0-9A-Fa-f]{4})"  # right after \uXXXX
        r'|(?<=\\)(?![nrtbfu"/\\]))'  # after a backslash that does not start a JSON escape
    )


_LEFT: Mapping[str, str] = MappingProxyType(
    {"word": _left(_WORD), "token": _left(_TOKENISH_LEFT_BYTES), "none": "", "lead": ""}
)
_RIGHT: Mapping[str, str] = MappingProxyType(
    {
        "word": r"(?!" + _WORD + r")",
        "token": r"(?!" + _TOKENISH_RIGHT_BYTES + r")(?!\." + _TOKENISH_RIGHT_BYTES + r")",
        "none": "",
    }
)

# Opcodes of the regex parser that Hyperscan cannot honour the way Python does.
_sre: Any = importlib.import_module("re._parser")
_sre_c: Any = importlib.import_module("re._constants")
_FORBIDDEN_OPS: Mapping[Any, str] = MappingProxyType(
    {
        _sre_c.AT: "anchors / \\b / \\B are not allowed",
        _sre_c.ASSERT: "look-around is not allowed",
        _sre_c.ASSERT_NOT: "look-around is not allowed",
        _sre_c.GROUPREF: "back-references are not allowed",
        _sre_c.GROUPREF_EXISTS: "conditional groups are not allowed",
        _sre_c.ATOMIC_GROUP: "atomic groups are not allowed",
        _sre_c.POSSESSIVE_REPEAT: "possessive quantifiers are not allowed",
        _sre_c.MIN_REPEAT: "lazy quantifiers are not allowed",
        _sre_c.ANY: "'.' is not allowed (use an explicit class)",
    }
)


class CatalogueError(ValueError):
    """The catalogue data is malformed; the message names the rule id and the problem."""


_Fail = Callable[[str], CatalogueError]


@dataclass(frozen=True)
class Rule:
    """One credential format. ``max_width`` is the longest match ``pattern`` can produce."""

    id: str
    description: str
    keywords: tuple[str, ...]
    pattern: str
    secret_group: int
    min_entropy: float | None
    allow: frozenset[str]
    left: str
    right: str
    advisory: bool
    max_width: int
    validators: tuple[str, ...] = ()
    context_only: str | None = None


@dataclass(frozen=True)
class Catalogue:
    version: str
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class FormatMatch:
    """A confirmed match; ``start``/``end`` are byte offsets in the scanned buffer."""

    rule_id: str
    start: int
    end: int


# ------------------------------------------------------------------------------------ loading


def load_catalogue(data: bytes | None = None) -> Catalogue:
    """Parse and validate a catalogue; ``None`` loads the packaged ``catalogue.json``."""
    if data is None:
        data = importlib.resources.files("gateway.inspection").joinpath("catalogue.json").read_bytes()
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CatalogueError(f"catalogue is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CatalogueError("catalogue must be a JSON object")
    unknown = set(doc) - {"version", "rules"}
    if unknown:
        raise CatalogueError(f"catalogue has unknown keys {sorted(unknown)}")
    version = doc.get("version")
    if not isinstance(version, str) or not version:
        raise CatalogueError("catalogue 'version' must be a non-empty string")
    raw_rules = doc.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise CatalogueError("catalogue 'rules' must be a non-empty list")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_rules):
        rule = _parse_rule(index, raw)
        if rule.id in seen:
            raise CatalogueError(f"rule {rule.id!r}: duplicate id")
        seen.add(rule.id)
        rules.append(rule)
    return Catalogue(version=version, rules=tuple(rules))


def _parse_rule(index: int, raw: object) -> Rule:
    if not isinstance(raw, dict):
        raise CatalogueError(f"rule #{index}: must be a JSON object")
    rid = raw.get("id")
    if not isinstance(rid, str) or not _ID_RE.fullmatch(rid):
        raise CatalogueError(f"rule #{index} ({rid!r}): id must match ^[a-z0-9][a-z0-9-]{{2,62}}$")

    def fail(problem: str) -> CatalogueError:
        return CatalogueError(f"rule {rid!r}: {problem}")

    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise fail(f"unknown keys {sorted(unknown)}")
    missing = _REQUIRED_KEYS - set(raw)
    if missing:
        raise fail(f"missing keys {sorted(missing)}")

    description = raw["description"]
    if not isinstance(description, str) or not description.strip() or "\n" in description:
        raise fail("description must be a non-empty single line")

    keywords = raw["keywords"]
    if not isinstance(keywords, list) or not keywords:
        raise fail("keywords must be a non-empty list")
    for kw in keywords:
        # Matched against the data with ASCII letters lowered and other bytes as they are:
        # a non-ASCII keyword (a name such as 密钥) must appear verbatim in every match.
        if not isinstance(kw, str) or not kw or kw != kw.lower() or not kw.isprintable():
            raise fail(f"keyword {kw!r} must be a non-empty lowercase printable string")

    pattern = raw["pattern"]
    if not isinstance(pattern, str) or not pattern or not pattern.isascii():
        raise fail("pattern must be a non-empty ASCII string")
    groups, max_width = _check_pattern(pattern, fail)

    secret_group = raw.get("secret_group", 0)
    if type(secret_group) is not int or not 0 <= secret_group < groups:
        raise fail(f"secret_group must be an int in [0, {groups - 1}]")

    min_entropy = raw.get("min_entropy")
    if min_entropy is not None:
        if type(min_entropy) not in (int, float) or not 0.0 <= min_entropy <= 8.0:
            raise fail("min_entropy must be null or a number in [0, 8]")
        min_entropy = float(min_entropy)

    allow = raw.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) and a for a in allow):
        raise fail("allow must be a list of non-empty strings")

    left = raw.get("left", "word")
    right = raw.get("right", "word")
    if left not in BOUNDARY_KINDS | LEFT_ONLY_KINDS or right not in BOUNDARY_KINDS:
        raise fail(f"left/right must be one of {sorted(BOUNDARY_KINDS)} (left may also be 'lead')")
    if left == "lead":
        if secret_group < 1:
            raise fail("a 'lead' rule reports its secret group: secret_group must be >= 1")
        if not _split_flags(pattern)[0].startswith(LEAD):
            raise fail("a 'lead' rule's pattern must start with catalogue.LEAD")

    advisory = raw.get("advisory", False)
    if not isinstance(advisory, bool):
        raise fail("advisory must be a boolean")

    validators = raw.get("validators", [])
    if not isinstance(validators, list) or not all(isinstance(v, str) for v in validators):
        raise fail("validators must be a list of names")
    unknown_validators = sorted(set(validators) - set(VALIDATORS))
    if unknown_validators:
        raise fail(f"unknown validators {unknown_validators}; known: {sorted(VALIDATORS)}")
    if len(set(validators)) != len(validators):
        raise fail("validators must not repeat")

    context_only = raw.get("context_only")
    if context_only is not None and (
        not isinstance(context_only, str) or not context_only.strip() or "\n" in context_only
    ):
        raise fail("context_only must be null or a non-empty single-line reason")

    return Rule(
        id=rid,
        description=description,
        keywords=tuple(keywords),
        pattern=pattern,
        secret_group=secret_group,
        min_entropy=min_entropy,
        allow=frozenset(allow),
        left=left,
        right=right,
        advisory=advisory,
        max_width=max_width,
        validators=tuple(validators),
        context_only=context_only,
    )


def _split_flags(pattern: str) -> tuple[str, int]:
    """Strip the only allowed inline flag, a leading ``(?i)``, into ``re`` flags."""
    if pattern.startswith("(?i)"):
        return pattern[4:], re.IGNORECASE
    return pattern, 0


def _check_pattern(pattern: str, fail: _Fail) -> tuple[int, int]:
    """Validate the Hyperscan-compatible subset; return (group count incl. 0, max width)."""
    body, flags = _split_flags(pattern)
    try:
        re.compile(body.encode("ascii"), flags)
        parsed = _sre.parse(body.encode("ascii"), flags)
    except re.error as exc:
        raise fail(f"pattern does not compile: {exc}") from exc
    if parsed.state.flags & ~re.IGNORECASE:
        raise fail("only a leading (?i) inline flag is allowed")
    if parsed.state.groupdict:
        raise fail("named groups are not allowed")
    _walk(parsed, fail)
    lo, hi = parsed.getwidth()
    if lo < 1:
        raise fail("pattern can match the empty string")
    if hi > MAX_PATTERN_WIDTH:
        raise fail(f"pattern width must be bounded by {MAX_PATTERN_WIDTH} (got {hi})")
    return int(parsed.state.groups), int(hi)


def _walk(items: Any, fail: _Fail) -> None:
    for op, av in items:
        if op in _FORBIDDEN_OPS:
            raise fail(_FORBIDDEN_OPS[op])
        if op is _sre_c.MAX_REPEAT:
            lo, hi, sub = av
            if hi == _sre_c.MAXREPEAT:
                raise fail("unbounded repeat (*, +, {n,}) is not allowed")
            _walk(sub, fail)
        elif op is _sre_c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise fail("scoped inline flags are not allowed")
            _walk(sub, fail)
        elif op is _sre_c.BRANCH:
            for alternative in av[1]:
                _walk(alternative, fail)


# ------------------------------------------------------------------------------ confirmation


@functools.lru_cache(maxsize=1024)
def confirm_regex(rule: Rule) -> re.Pattern[bytes]:
    """The rule's pattern wrapped in its left/right boundary look-arounds (bytes regex)."""
    body, flags = _split_flags(rule.pattern)
    wrapped = _LEFT[rule.left] + "(?:" + body + ")" + _RIGHT[rule.right]
    return re.compile(wrapped.encode("ascii"), flags)


def shannon_entropy(data: bytes) -> float:
    """Shannon entropy of ``data`` in bits per byte (0.0 for empty input)."""
    if not data:
        return 0.0
    total = len(data)
    counts: dict[int, int] = {}
    for byte in data:
        counts[byte] = counts.get(byte, 0) + 1
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def _is_placeholder(secret: bytes) -> bool:
    lowered = secret.lower().decode("latin-1")
    if any(marker in lowered for marker in PLACEHOLDER_MARKERS):
        return True
    return _ENV_REF_RE.fullmatch(secret) is not None or _IDENTIFIER_RE.fullmatch(secret) is not None


# ---------------------------------------------------------------------------- validators


def _mixed_classes(secret: bytes) -> bool:
    """An ASCII upper-case letter, a lower-case letter and a digit (random keys mix them)."""
    return all(re.search(cls, secret) is not None for cls in (rb"[A-Z]", rb"[a-z]", rb"[0-9]"))


def _letter_and_digit(secret: bytes) -> bool:
    """At least one ASCII letter and one digit (rules out plain numbers and words)."""
    return all(re.search(cls, secret) is not None for cls in (rb"[A-Za-z]", rb"[0-9]"))


def _has_symbol(secret: bytes) -> bool:
    """A byte that is not an ASCII letter or digit (``+ /`` in base64, ``- _`` in base64url):
    tells a random base64 key from an equally random but purely alphanumeric identifier."""
    return re.fullmatch(rb"[A-Za-z0-9]*", secret) is None


def _class(byte: int) -> int:
    if 65 <= byte <= 90:
        return 0  # upper
    if 97 <= byte <= 122:
        return 1  # lower
    if 48 <= byte <= 57:
        return 2  # digit
    return 3


def _class_changes(secret: bytes) -> bool:
    """At least 40% of adjacent bytes change class (upper / lower / digit / other): random
    base64 changes class at ~65% of positions (fewer than 40% in about 1 key in 1000), while
    words, identifiers and paths stay in one class for a whole word."""
    changes = sum(_class(a) != _class(b) for a, b in zip(secret, secret[1:], strict=False))
    return changes * 5 >= (len(secret) - 1) * 2


def _not_path(secret: bytes) -> bool:
    """At most three '/': a 40-character base64 key has four or more about once in 230; a
    value with that many reads as a path (``app/Http/Controllers/Api/V1/UserProfile2``)."""
    return secret.count(b"/") <= 3


def _discord_snowflake(secret: bytes) -> bool:
    """The first dot-separated segment is unpadded base64(url) of a Discord user id: a
    snowflake of 17-20 decimal digits that does not start with 0."""
    first = secret.split(b".", 1)[0]
    try:
        decoded = base64.urlsafe_b64decode(first + b"=" * (-len(first) % 4))
    except (binascii.Error, ValueError):
        return False
    if base64.urlsafe_b64encode(decoded).rstrip(b"=") != first:
        return False  # not the canonical encoding of what it decodes to
    return re.fullmatch(rb"[1-9][0-9]{16,19}", decoded) is not None


#: The closed set of named acceptance checks a rule may select with ``validators``. Each
#: takes the secret part and returns whether it is acceptable.
VALIDATORS: Mapping[str, Callable[[bytes], bool]] = MappingProxyType(
    {
        "mixed_classes": _mixed_classes,
        "letter_and_digit": _letter_and_digit,
        "has_symbol": _has_symbol,
        "class_changes": _class_changes,
        "not_path": _not_path,
        "discord_snowflake": _discord_snowflake,
    }
)


def accept(rule: Rule, m: re.Match[bytes]) -> bool:
    """Allow-list, placeholder markers, entropy floor and validators, on the secret part."""
    secret = m.group(rule.secret_group)
    if not secret:
        return False
    if secret.decode("latin-1") in rule.allow:
        return False
    if _is_placeholder(secret):
        return False
    if rule.min_entropy is not None and shannon_entropy(secret) < rule.min_entropy:
        return False
    return all(VALIDATORS[name](secret) for name in rule.validators)


def _start(rule: Rule, m: re.Match[bytes]) -> int:
    """Where a match is reported to start: a ``lead`` rule's neighbour is not part of it."""
    return m.start(rule.secret_group) if rule.left == "lead" else m.start()


def _candidates(
    rx: re.Pattern[bytes], data: bytes, pos: int, endpos: int, start_limit: int
) -> Iterator[re.Match[bytes]]:
    """The preferred match at every start offset in [pos, start_limit) that has one."""
    while pos < start_limit:
        m = rx.search(data, pos, endpos)
        if m is None or m.start() >= start_limit:
            return
        yield m
        pos = m.start() + 1


def _scan_rule(rule: Rule, data: bytes) -> list[FormatMatch]:
    rx = confirm_regex(rule)
    best: dict[int, int] = {}  # end -> smallest start of an accepted candidate
    for m in _candidates(rx, data, 0, len(data), len(data)):
        if m.end() not in best and accept(rule, m):
            best[m.end()] = _start(rule, m)
    return [FormatMatch(rule.id, start, end) for end, start in best.items()]


def reference_scan(catalogue: Catalogue, data: bytes, *, include_advisory: bool = True) -> list[FormatMatch]:
    """Slow engine: keyword prefilter, then every rule's confirmation regex over ``data``.

    Returns all accepted matches sorted by ``(start, rule_id)`` (then ``end``); overlapping
    matches of different rules are all reported.
    """
    lowered = data.lower()
    found: list[FormatMatch] = []
    for rule in catalogue.rules:
        if rule.advisory and not include_advisory:
            continue
        if not any(kw.encode("utf-8") in lowered for kw in rule.keywords):
            continue
        found.extend(_scan_rule(rule, data))
    found.sort(key=lambda f: (f.start, f.rule_id, f.end))
    return found


def confirm_in_window(rule: Rule, data: bytes, end: int) -> list[FormatMatch]:
    """Confirm a Hyperscan-reported match end of ``rule`` (what the fast path calls).

    Candidate starts are searched in ``data[max(0, end - rule.max_width - 2) : end]`` (the
    look-behind may read the few bytes before that). Only accepted candidates that end
    exactly at ``end`` are returned, at most one (the earliest start), which is precisely
    what :func:`reference_scan` reports for that end offset; every match the reference scan
    reports ends where Hyperscan reports a raw-pattern match, so the union over all reported
    ends equals the reference result.

    Each candidate is evaluated with the real following bytes visible (up to
    ``end + rule.max_width + 1``, the furthest any candidate starting before ``end`` can
    look), not cut at ``end + 2``: a cut would let an alternative ending at ``end + 1``, whose
    real right-hand neighbour rejects it, pass against the artificial end of the buffer and
    shadow the genuine match ending at ``end``.
    """
    if end < 1 or end > len(data):
        return []
    lo = max(0, end - rule.max_width - 2)
    endpos = min(len(data), end + rule.max_width + 1)
    rx = confirm_regex(rule)
    for m in _candidates(rx, data, lo, endpos, end):
        if m.end() == end and accept(rule, m):
            return [FormatMatch(rule.id, _start(rule, m), end)]
    return []
