"""Inspection benchmark: what deciding on one request costs, in process and over the wire.

Part 1 runs in this process, pinned to one core. A realistic agent-traffic OpenAI chat
request (4 KB, 100 KB, 2 MB) is decided on with the full built-in credential catalogue and
1,000 configured secret values, none of which occur in the payloads, so every decision must
be `allow`. Cases, interleaved round by round:

* ``full decision``      -- carrier parse + `Engine.inspect` (raw bytes and decoded units);
* ``engine only``        -- `Engine.inspect` on units parsed beforehand;
* ``parse only``         -- the carrier parse alone;
* ``checks.before_send`` -- carrier parse + the proxy's complete `before_send` (destination
  check, header units, binding sealing);
* ``python engine``      -- the full decision with the documented slow engine (baseline);
* ``full, py reader`` and ``parse, py reader`` -- the full decision and the parse with the
  pure-Python reference JSON reader instead of the native one (when that is built), so the
  native/reference ratio comes from the same run;
* ``full, py decoders`` -- the full decision with the encoded-run finder's pure-Python
  reference (decoders.py) instead of its native module, likewise.

Part 2 runs the wire benchmark's ``chat-200KB c=1`` workload with the gateway configured with
1,000 secret values: direct vs gateway-https vs gateway-uds.

    .venv/bin/python bench/inspect_bench.py [--quick] [--json PATH]

Timing results are informational: the exit status is non-zero only when a decision was not
`allow`, a request failed (anything but a 200) or the set-up did not come up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from string import Template
from typing import Any

import wire_bench  # bench/ is on sys.path (this script's directory, or run_all's)
from wire_bench import BenchError, Check, Stats, WorkloadResult, percentile

from gateway.carriers import CARRIERS, jsonraw
from gateway.carriers.base import CarrierLimits, ParsedRequest
from gateway.checks import runner as checks
from gateway.checks.destination import Target
from gateway.config.load import load_runtime
from gateway.config.runtime import Runtime
from gateway.inspection import decoders, literals
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Engine, Subject
from gateway.inspection.formats import FormatSet, build_format_set
from gateway.inspection.rules import HyperscanMatcher
from gateway.inspection.verdict import Verdict
from gateway.vocab import Decision, Mode
from tests.harness import build_env, mock_profile

SECRET_COUNT = 1000
SEED = 1729
CARRIER = CARRIERS["openai.chat"]
LIMITS = CarrierLimits()
PROFILE_ID = "bench-openai"
POLICY_VERSION = "bench-1"
REQUEST_HEADERS = {"content-type": "application/json"}
ROUNDS = 5  # timed rounds per case, interleaved case by case
SIZE_TOLERANCE = 0.05
WIRE_WORKLOAD = "chat-200KB c=1"
THROUGHPUT_TARGET_MBPS = 250.0  # the speed issue's (an earlier one asked 150)
THROUGHPUT_TARGET_MIN_BYTES = 100 * 1024
P50_TARGET_MS = 1.0
P50_TARGET_SIZE = "100 KB"
MB = 1_000_000  # throughput is reported in MB/s of 10^6 bytes


@dataclass(frozen=True)
class Size:
    label: str
    target_bytes: int
    iterations: int  # timed, per case, over all rounds
    python_iterations: int  # the slow engine's; 0 skips it at this size


FULL_SIZES = (
    Size("4 KB", 4 * 1024, 2000, 100),
    Size("100 KB", 100 * 1024, 300, 15),
    Size("2 MB", 2 * 1024 * 1024, 30, 2),
)
QUICK_SIZES = (
    Size("4 KB", 4 * 1024, 200, 10),
    Size("100 KB", 100 * 1024, 30, 3),
    Size("2 MB", 2 * 1024 * 1024, 3, 0),
)


class NotAllowed(RuntimeError):
    """A payload was not decided `allow` (it should hold no secrets)."""


# --- payloads: deterministic agent traffic -----------------------------------------------

MODULES = (
    "orders",
    "billing",
    "inventory",
    "shipping",
    "accounts",
    "reports",
    "search",
    "notifications",
    "catalog",
    "scheduler",
)
NOUNS = ("order", "invoice", "customer", "item", "shipment", "report", "session", "batch", "record", "event")
VERBS = ("load", "parse", "validate", "render", "sync", "merge", "compute", "fetch", "update", "archive")
STATUSES = ("pending", "active", "shipped", "cancelled", "failed", "archived")

PROSE = (
    "The nightly import job started failing after we upgraded the database driver last week.",
    "Can you look at why the totals on the billing page no longer match the exported CSV?",
    "I would like the retry logic to back off exponentially instead of waiting a fixed second.",
    "Most of the slowness seems to come from loading every record before filtering it.",
    "Please keep the public interface unchanged so that the mobile client does not break.",
    "The tests pass locally but fail in CI with a timeout on the integration suite.",
    "I checked the logs and the error appears only when two workers pick up the same batch.",
    "We agreed to move configuration into environment variables rather than a YAML file.",
    "Before changing anything, read the module and summarise how the cache is invalidated.",
    "The function returns early when the list is empty, which hides a missing status update.",
    "A simpler fix is to sort the records once and then walk them with two pointers.",
    "I have updated the migration so that the new column has a default and is not nullable.",
    "The scheduler runs every five minutes and each run should take well under a minute.",
    "Let me know which files you changed and why, and run the affected tests afterwards.",
    "The pagination helper drops the last page when the total is an exact multiple of the size.",
    "Our style guide prefers small pure functions and type hints on every public function.",
    "Customers in the eastern region see their invoices a day late because of the timezone.",
    "The search endpoint should rank exact title matches above partial description matches.",
    "There is a race between the webhook handler and the reconciliation job on refunds.",
    "The profiler output shows that JSON serialisation dominates the request time.",
    "The README still describes the old deployment steps from before the container move.",
    "Error messages should say what went wrong and what the user can do about it.",
    "The report generator runs out of memory on the largest tenant when building the PDF.",
    "Add a regression test that reproduces the bug before you change the implementation.",
    "The feature flag can be removed now that the new checkout flow is enabled everywhere.",
)
NON_ASCII_PROSE = (
    "The café in Zürich says names like Zoë and José are rejected by the signup form.",
    "Our office in 東京 (日本) exports dates as 2024年3月15日 in the monthly spreadsheet.",
    "Keep the résumé parser working for UTF-8 and Latin-1 uploads — see the naïve decoder.",
)
SYSTEM_RULES = (
    "Read the relevant files before proposing a change; never guess at code you have not seen.",
    "Prefer small, reviewable edits and explain each change in one or two sentences.",
    "Run the tests that cover the code you changed and report the results as they are.",
    "Do not modify files outside the repository or add dependencies without asking first.",
    "When a command fails, read its output carefully before trying something else.",
    "Keep the existing style: type hints, docstrings on public functions, no wildcard imports.",
    "If the request is ambiguous, ask one clarifying question instead of assuming.",
    "Summarise what you did at the end: files touched, tests run, anything left to do.",
    "Never print or log personal data or the contents of environment files.",
    "Use the search tool to find callers before renaming or removing a function.",
    "Database migrations must be reversible and must not lock large tables for long.",
    "Answer in the language the user writes in, and keep answers short unless asked.",
)

PY_BLOCKS = (
    '''def ${verb}_${noun}s(${noun}s: list[${Noun}], *, limit: int = ${n}) -> dict[str, int]:
    """${Verb} up to `limit` ${noun}s and count them by status."""
    counts: dict[str, int] = {}
    for ${noun} in ${noun}s[:limit]:
        if ${noun}.status == "${status}":
            continue
        counts[${noun}.status] = counts.get(${noun}.status, 0) + 1
    logger.debug("${verb}: %d ${noun}s in %d states", len(${noun}s), len(counts))
    return counts
''',
    '''@dataclass(frozen=True)
class ${Noun}Summary:
    """One line of the ${module} report."""

    ${noun}_id: int
    status: str = "${status}"
    total_cents: int = 0
    tags: tuple[str, ...] = ()

    def label(self) -> str:
        return f"${Noun} #{self.${noun}_id} ({self.status}, {self.total_cents / 100:.2f})"
''',
    """def test_${verb}_${noun}s_skips_${status}(make_${noun}: Callable[..., ${Noun}]) -> None:
    ${noun}s = [make_${noun}(status="${status}") for _ in range(${n})]
    assert ${verb}_${noun}s(${noun}s) == {}
""",
    """async def ${verb}_${other}_page(session: AsyncSession, page: int, size: int = 50) -> Page:
    query = select(${Other}).where(${Other}.status != "${status}").order_by(${Other}.id)
    rows = (await session.execute(query.offset(page * size).limit(size))).scalars().all()
    return Page(items=[${Other}Out.model_validate(row) for row in rows], page=page, size=size)
""",
)
TS_BLOCKS = (
    """export async function ${verb}${Noun}(
  id: string,
  signal?: AbortSignal,
): Promise<${Noun} | null> {
  const response = await fetch(`/api/${module}/$${id}`, { signal });
  if (response.status === 404) {
    return null;
  }
  if (!response.ok) {
    throw new Error(`${verb} ${noun} failed: $${response.status}`);
  }
  return (await response.json()) as ${Noun};
}
""",
    """export function ${noun}Totals(rows: ${Noun}[]): Map<string, number> {
  const totals = new Map<string, number>();
  for (const row of rows.filter((r) => r.status !== "${status}")) {
    totals.set(row.region, (totals.get(row.region) ?? 0) + row.amountCents);
  }
  return totals;
}
""",
)
SQL_BLOCKS = (
    """SELECT c.id, c.name, COUNT(o.id) AS ${noun}_count
FROM customers AS c
LEFT JOIN ${module} AS o ON o.customer_id = c.id AND o.status <> '${status}'
WHERE c.created_at >= NOW() - INTERVAL '${n} days'
GROUP BY c.id, c.name
ORDER BY ${noun}_count DESC;
""",
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_${module}_${noun}_status
    ON ${module} (${noun}_id, status)
    WHERE status IN ('${status}', 'pending');
""",
)
LANGUAGES = {"py": PY_BLOCKS, "ts": TS_BLOCKS, "sql": SQL_BLOCKS}
FILE_HEADERS = {
    "py": '"""${Noun} handling for the ${module} service."""\n\nfrom __future__ import annotations'
    "\n\nimport logging\nfrom dataclasses import dataclass\n\n"
    "logger = logging.getLogger(__name__)\n\n",
    "ts": 'import type { ${Noun} } from "../types";\n\n',
    "sql": "-- ${module}: reporting queries\n\n",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in params.items()},
                "required": [next(iter(params))],
            },
        },
    }
    for name, description, params in (
        ("read_file", "Read a file of the repository.", {"path": "string"}),
        (
            "search_code",
            "Search the repository with a regular expression.",
            {"pattern": "string", "path_glob": "string"},
        ),
        ("run_command", "Run a shell command in the repository root.", {"command": "string", "timeout_s": "integer"}),
        ("web_search", "Search the web.", {"query": "string", "max_results": "integer"}),
        ("edit_file", "Replace text in a file.", {"path": "string", "old_text": "string", "new_text": "string"}),
    )
]
ID_ALPHABET = string.ascii_letters + string.digits
SMALL_PIECE = 1000  # below this piece size an exchange is one call, without pasted code
EXCHANGE_ATTEMPTS = 5


class Writer:
    """Deterministic agent-conversation pieces, all drawn from one seeded generator."""

    def __init__(self, seed: int, piece_chars: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - reproducible payloads, not security
        self.piece = piece_chars  # typical size of one file, command output or search result
        self.calls = 0

    def names(self) -> dict[str, str]:
        noun, other, verb = (self.rng.choice(NOUNS), self.rng.choice(NOUNS), self.rng.choice(VERBS))
        return {
            "noun": noun,
            "Noun": noun.capitalize(),
            "other": other,
            "Other": other.capitalize(),
            "verb": verb,
            "Verb": verb.capitalize(),
            "module": self.rng.choice(MODULES),
            "status": self.rng.choice(STATUSES),
            "n": str(self.rng.randint(2, 500)),
        }

    def prose(self, sentences: int, non_ascii: float = 0.0) -> str:
        out = [self.rng.choice(PROSE) for _ in range(sentences)]
        if self.rng.random() < non_ascii:
            out.insert(self.rng.randrange(len(out) + 1), self.rng.choice(NON_ASCII_PROSE))
        return " ".join(out)

    def block(self, language: str = "py") -> str:
        """One function, class or statement."""
        return Template(self.rng.choice(LANGUAGES[language])).substitute(self.names())

    def code(self, chars: int, language: str = "py") -> str:
        """A source file of at least one block and about `chars` characters."""
        parts = [Template(FILE_HEADERS[language]).substitute(self.names())]
        size = len(parts[0])
        while size < chars or len(parts) == 1:
            parts.append(self.block(language) + "\n")
            size += len(parts[-1])
        return "".join(parts)

    def test_output(self, chars: int) -> str:
        """pytest output: a line per test file, then one failure."""
        lines = [
            "=" * 29 + " test session starts " + "=" * 30,
            "platform linux -- Python 3.11.9, pytest-8.2.0, pluggy-1.5.0",
            "rootdir: /home/dev/shop",
            "",
        ]
        passed = 0
        while sum(map(len, lines)) < chars:
            dots = self.rng.randint(5, 60)
            passed += dots
            lines.append(f"tests/test_{self.rng.choice(MODULES)}_{self.rng.choice(NOUNS)}.py {'.' * dots}")
        names = self.names()
        case = Template("test_${verb}_${noun}s_skips_${status}").substitute(names)
        lines += [
            "",
            "=" * 35 + " FAILURES " + "=" * 35,
            f"{'_' * 20} {case} {'_' * 20}",
            "",
            f">       assert {names['verb']}_{names['noun']}s(rows) == {{}}",
            f"E       AssertionError: assert {{'{names['status']}': 1}} == {{}}",
            "",
            f"FAILED tests/test_{names['module']}.py::{case} - AssertionError",
            f"{'=' * 20} 1 failed, {passed} passed in {self.rng.uniform(1, 30):.2f}s {'=' * 20}",
        ]
        return "\n".join(lines)

    def tool_call(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """One tool call (arguments as a JSON string) and its JSON result."""
        self.calls += 1
        call_id = "call_" + "".join(self.rng.choice(ID_ALPHABET) for _ in range(24))
        n = self.names()
        kind = self.rng.choice(("read_file", "read_file", "search_code", "run_command", "web_search", "edit_file"))
        args: dict[str, Any]
        result: dict[str, Any]
        if kind == "read_file":
            language = self.rng.choice(("py", "py", "py", "ts", "sql"))
            path = f"src/{n['module']}/{n['noun']}_service.{language}"
            args = {"path": path}
            result = {"path": path, "content": self.code(self.piece, language), "encoding": "utf-8"}
        elif kind == "search_code":
            args = {"pattern": f"def {n['verb']}_", "path_glob": "src/**/*.py"}
            matches: list[dict[str, Any]] = []
            while sum(len(m["text"]) + 40 for m in matches) < self.piece // 2:
                line = self.rng.choice(self.block().splitlines())
                matches.append(
                    {
                        "path": f"src/{self.rng.choice(MODULES)}/service.py",
                        "line": self.rng.randint(1, 900),
                        "text": line.strip(),
                    }
                )
            result = {"matches": matches, "truncated": False}
        elif kind == "run_command":
            args = {"command": f"python -m pytest -q tests/test_{n['module']}.py", "timeout_s": 300}
            result = {"exit_code": 1, "stdout": self.test_output(self.piece), "stderr": ""}
        elif kind == "web_search":
            args = {"query": f"python {n['verb']} {n['noun']} {n['status']} best practice", "max_results": 5}
            result = {
                "results": [
                    {
                        "title": f"How to {n['verb']} {self.rng.choice(NOUNS)}s in Python",
                        "url": f"https://docs.example.org/{n['module']}/{self.rng.randint(1, 9999)}",
                        "snippet": self.prose(3, non_ascii=0.1),
                    }
                    for _ in range(max(1, self.piece // 600))
                ]
            }
        else:
            path = f"src/{n['module']}/{n['noun']}_service.py"
            old, new = self.block(), self.block()
            args = {"path": path, "old_text": old, "new_text": new}
            diff = [f"--- a/{path}", f"+++ b/{path}", "@@ -1,12 +1,12 @@"]
            diff += [f"-{line}" for line in old.splitlines()]
            diff += [f"+{line}" for line in new.splitlines()]
            result = {"ok": True, "diff": "\n".join(diff)}
        call = {"id": call_id, "type": "function", "function": {"name": kind, "arguments": json.dumps(args)}}
        return call, {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}

    def system_prompt(self, chars: int) -> str:
        lines = [
            "You are a coding agent working in the user's repository through the tools listed below.",
            "",
            "# Rules",
        ]
        rules = list(SYSTEM_RULES)
        while sum(map(len, lines)) < chars // 2:
            lines.append(f"- {rules[len(lines) % len(rules)]}")
        lines += ["", "# Repository layout"]
        while sum(map(len, lines)) < chars:
            n = self.names()
            lines.append(
                f"src/{n['module']}/{n['noun']}_{n['verb']}.py  -- "
                f"{n['Verb']}s {n['noun']}s for the {n['module']} service."
            )
        return "\n".join(lines)

    def exchange(self) -> list[dict[str, Any]]:
        """A user turn, one to three rounds of tool calls, and the assistant's answer
        (one round of one call, and no pasted code, in a small request)."""
        small = self.piece < SMALL_PIECE
        user = self.prose(self.rng.randint(1, 3 if small else 6), non_ascii=0.2)
        if not small and self.rng.random() < 0.3:
            user += "\n\n```python\n" + self.code(self.piece // 4) + "```"
        messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
        for _ in range(1 if small else self.rng.randint(1, 3)):
            pairs = [self.tool_call() for _ in range(1 if small else self.rng.choice((1, 1, 2)))]
            messages.append(
                {
                    "role": "assistant",
                    "content": self.prose(1) if self.rng.random() < 0.5 else None,
                    "tool_calls": [call for call, _ in pairs],
                }
            )
            messages += [result for _, result in pairs]
        answer = self.prose(self.rng.randint(1, 2) if small else self.rng.randint(2, 5), non_ascii=0.1)
        if not small and self.rng.random() < 0.5:
            answer += "\n\n```python\n" + self.code(self.piece // 3) + "```\n\n" + self.prose(2)
        messages.append({"role": "assistant", "content": answer})
        return messages


def encode(document: Any) -> bytes:
    """As HTTP clients send it: compact, UTF-8 (not ASCII-escaped)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def agent_request(target_bytes: int, seed: int = SEED) -> bytes:
    """An OpenAI chat request of about `target_bytes`: a long system prompt, then whole
    exchanges while they fit, then a closing user message (starting with a little non-ASCII
    text) sized to hit the target."""
    writer = Writer(seed, piece_chars=min(max(target_bytes // 25, 250), 6000))
    system = writer.system_prompt(min(max(target_bytes // 8, 600), 12_000))
    head: dict[str, Any] = {
        "model": wire_bench.MODEL,
        "tools": TOOLS,
        "messages": [{"role": "system", "content": system}],
    }
    messages: list[dict[str, Any]] = []
    used, misses = len(encode(head)), 0
    while misses < EXCHANGE_ATTEMPTS:  # a few more tries with other (smaller) exchanges
        exchange = writer.exchange()
        cost = sum(len(encode(m)) + 1 for m in exchange)
        if used + cost > target_bytes * (1 - 2 * SIZE_TOLERANCE):
            misses += 1
            continue
        messages += exchange
        used += cost
    closing = NON_ASCII_PROSE[0] + " " + writer.prose(target_bytes // 40 + 10)

    def body(chars: int) -> bytes:
        last = {"role": "user", "content": closing[: max(chars, 1)]}
        return encode(head | {"messages": [*head["messages"], *messages, last]})

    chars = target_bytes - used
    for _ in range(4):  # converge on the target (the closing prose is cut in its ASCII part)
        chars += target_bytes - len(body(chars))
    raw = body(chars)
    if abs(len(raw) - target_bytes) > SIZE_TOLERANCE * target_bytes:
        raise BenchError(f"payload of {len(raw):,} B is not within 5 % of {target_bytes:,} B")
    return raw


@dataclass(frozen=True)
class Payload:
    size: Size
    raw: bytes
    parsed: ParsedRequest

    @property
    def subject(self) -> Subject:
        return subject_of(self.raw, self.parsed)

    def composition(self) -> str:
        messages = self.parsed.doc["messages"]
        calls = sum(len(m.get("tool_calls") or ()) for m in messages)
        units = self.parsed.units
        non_ascii = [u for u in units if not u.text.isascii()]
        share = sum(len(u.text) for u in non_ascii) / max(sum(len(u.text) for u in units), 1)
        return (
            f"{len(messages)} messages, {calls} tool call(s); {len(units):,} decoded text "
            f"units, {len(non_ascii)} with non-ASCII text ({share:.0%} of the characters)"
        )


def subject_of(raw: bytes, parsed: ParsedRequest) -> Subject:
    return Subject(raw=raw, units=parsed.units, opaque=parsed.opaque, duplicate_keys=parsed.duplicate_keys)


# --- engines and the runtime for checks.before_send ------------------------------------


@dataclass(frozen=True)
class Engines:
    hyperscan: Engine
    python: Engine
    literal_forms: int
    format_rules: int
    formats_s: float  # loading the catalogue
    compile_s: float  # compiling the Hyperscan database (catalogue + literal forms)


def compile_engines(values: Sequence[str]) -> Engines:
    start = time.perf_counter()
    formats: FormatSet = build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={})
    loaded = time.perf_counter()
    hyperscan = build_engine(secret_values=values, formats=formats, policy_version=POLICY_VERSION)
    compiled = time.perf_counter()
    python = build_engine(secret_values=values, formats=formats, policy_version=POLICY_VERSION, engine="python")
    return Engines(
        hyperscan,
        python,
        sum(len(literals.variants(v)) for v in values),
        len(formats.rules),
        loaded - start,
        compiled - loaded,
    )


@dataclass(frozen=True)
class CheckSetup:
    """What `before_send` needs, exactly as the proxy calls it for one chat request."""

    runtime: Runtime
    party: checks.Party
    target: Target


@contextlib.contextmanager
def check_setup(values: Sequence[str]) -> Iterator[CheckSetup]:
    """A runtime loaded from a configuration directory built like the tests' (the built-in
    catalogue, no detectors, the same secret values, before_send enforced)."""
    with tempfile.TemporaryDirectory(prefix="inspect-bench-") as tmp:
        unused = "http://127.0.0.1:9"  # the provider is never contacted
        env = build_env(
            Path(tmp) / "config", unused, secrets_=list(values), profiles=[mock_profile(PROFILE_ID, "openai", unused)]
        )
        runtime = load_runtime(env.config)
        profile = runtime.profiles[PROFILE_ID]
        yield CheckSetup(
            runtime,
            checks.Party("bench", None, "default", profile),
            Target.for_profile(profile, CARRIER.name, CARRIER.path),
        )


def before_send(setup: CheckSetup, raw: bytes) -> checks.CheckOutcome:
    given = checks.SendInput(
        party=setup.party,
        parsed=(CARRIER.parse_request(raw, LIMITS),),
        body=raw,
        bound_headers=REQUEST_HEADERS,
        carriers=CARRIER.name,
        target=setup.target,
    )
    return checks.before_send(setup.runtime, given, route=None)


def validate(payload: Payload, engines: Engines, setup: CheckSetup) -> None:
    """Every way of deciding must allow, with no finding at all (advisory ones included)."""
    outcome = before_send(setup, payload.raw)
    verdicts = {
        "hyperscan": engines.hyperscan.inspect(payload.subject),
        "checks.before_send": outcome.verdict,
    }
    if payload.size.python_iterations:
        verdicts["python"] = engines.python.inspect(payload.subject)
    for name, verdict in verdicts.items():
        if verdict.decision is not Decision.ALLOW or verdict.findings:
            found = ", ".join(f"{f.reason} at {f.pointer}" for f in verdict.findings)
            raise NotAllowed(
                f"{payload.size.label} payload, {name}: {verdict.decision.value} "
                f"{list(verdict.reason_codes)}; findings: {found or 'none'}"
            )
    if outcome.mode is not Mode.ENFORCE or outcome.binding is None:
        raise BenchError(f"before_send: mode {outcome.mode.value}, binding {outcome.binding!r}")


# --- measurement -----------------------------------------------------------------------

FULL, ENGINE, PARSE, CHECKS, PYTHON, FULL_PY_READER, PARSE_PY_READER, FULL_PY_DECODERS = (
    "full decision",
    "engine only",
    "parse only",
    "checks.before_send",
    "python engine",
    "full, py reader",
    "parse, py reader",
    "full, py decoders",
)


@dataclass(frozen=True)
class Case:
    """One way of deciding on one payload: a call returning its verdict (None: parse only)."""

    name: str
    run: Callable[[], Verdict | None]
    iterations: int


def on_reference(use_native: Callable[[bool], None], run: Callable[[], Verdict | None]) -> Callable[[], Verdict | None]:
    """`run` with a module's pure-Python reference instead of its native path (`use_native`
    is that module's switch: jsonraw's reader or decoders' finder)."""

    def call() -> Verdict | None:
        use_native(False)
        try:
            return run()
        finally:
            use_native(True)

    return call


def cases(payload: Payload, engines: Engines, setup: CheckSetup) -> list[Case]:
    raw, subject, size = payload.raw, payload.subject, payload.size

    def full(engine: Engine) -> Callable[[], Verdict]:
        return lambda: engine.inspect(subject_of(raw, CARRIER.parse_request(raw, LIMITS)))

    def parse() -> None:
        CARRIER.parse_request(raw, LIMITS)

    out = [
        Case(FULL, full(engines.hyperscan), size.iterations),
        Case(ENGINE, lambda: engines.hyperscan.inspect(subject), size.iterations),
        Case(PARSE, parse, size.iterations),
        Case(CHECKS, lambda: before_send(setup, raw).verdict, size.iterations),
    ]
    if jsonraw.NATIVE_AVAILABLE:
        out.append(Case(FULL_PY_READER, on_reference(jsonraw.use_native, full(engines.hyperscan)), size.iterations))
        out.append(Case(PARSE_PY_READER, on_reference(jsonraw.use_native, parse), size.iterations))
    if decoders.NATIVE_AVAILABLE:
        out.append(Case(FULL_PY_DECODERS, on_reference(decoders.use_native, full(engines.hyperscan)), size.iterations))
    if size.python_iterations:
        out.append(Case(PYTHON, full(engines.python), size.python_iterations))
    return out


def warmup_count(iterations: int) -> int:
    return max(iterations // 10, 1) if iterations >= 3 else 0


def run_timed(case: Case, count: int) -> list[float]:
    """`count` calls, each timed alone (ms); every verdict must be `allow`."""
    clock = time.perf_counter_ns
    samples: list[float] = []
    for _ in range(count):
        start = clock()
        verdict = case.run()
        samples.append((clock() - start) / 1e6)
        if verdict is not None and verdict.decision is not Decision.ALLOW:
            raise NotAllowed(f"{case.name}: {verdict.decision.value} {list(verdict.reason_codes)}")
    return samples


def measure_cases(plan: Sequence[Case], rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Warm every case up, then time them in interleaved rounds, so that drift and
    background load hit every case alike."""
    for case in plan:
        run_timed(case, warmup_count(case.iterations))
    gc.collect()
    samples: dict[str, list[float]] = {case.name: [] for case in plan}
    for r in range(rounds):
        for case in plan:
            share = case.iterations * (r + 1) // rounds - case.iterations * r // rounds
            samples[case.name] += run_timed(case, share)
    return samples


@dataclass(frozen=True)
class CaseStats:
    iterations: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    mbps_p50: float  # payload bytes / p50 time
    mbps_mean: float  # payload bytes / mean time
    vs_full: float  # p50 / the full decision's p50


def summarize(samples: dict[str, list[float]], body_bytes: int) -> dict[str, CaseStats]:
    full_p50 = percentile(samples[FULL], 50) or 0.0
    stats: dict[str, CaseStats] = {}
    for name, values in samples.items():
        p50, p99 = percentile(values, 50) or 0.0, percentile(values, 99) or 0.0
        mean = statistics.fmean(values)
        stats[name] = CaseStats(
            len(values), p50, p99, mean, body_bytes / MB / (p50 / 1e3), body_bytes / MB / (mean / 1e3), p50 / full_p50
        )
    return stats


@dataclass(frozen=True)
class SizeResult:
    payload: Payload
    stats: dict[str, CaseStats]

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.payload.size.label,
            "target_bytes": self.payload.size.target_bytes,
            "body_bytes": len(self.payload.raw),
            "composition": self.payload.composition(),
            "cases": {name: asdict(s) for name, s in self.stats.items()},
        }


def format_size_table(result: SizeResult) -> str:
    payload = result.payload
    lines = [
        f"== {payload.size.label}: body {len(payload.raw):,} B (target {payload.size.target_bytes:,})",
        f"   {payload.composition()}",
        f"   {'case':<20}{'iters':>7}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}"
        f"{'MB/s p50':>10}{'MB/s mean':>11}{'x full':>9}",
    ]
    for name, s in result.stats.items():
        lines.append(
            f"   {name:<20}{s.iterations:>7}{s.p50_ms:>10.3f}{s.p99_ms:>10.3f}"
            f"{s.mean_ms:>10.3f}{s.mbps_p50:>10.1f}{s.mbps_mean:>11.1f}"
            f"{s.vs_full:>8.2f}x"
        )
    if FULL_PY_READER in result.stats:
        full_x = result.stats[FULL_PY_READER].p50_ms / result.stats[FULL].p50_ms
        parse_x = result.stats[PARSE_PY_READER].p50_ms / result.stats[PARSE].p50_ms
        lines.append(
            f"   native JSON reader: full decision {full_x:.2f}x, parse {parse_x:.2f}x as fast as the reference reader (p50)"
        )
    elif not jsonraw.NATIVE_AVAILABLE:
        lines.append("   native JSON reader not built: every case used the pure-Python reference reader")
    if FULL_PY_DECODERS in result.stats:
        x = result.stats[FULL_PY_DECODERS].p50_ms / result.stats[FULL].p50_ms
        lines.append(f"   native encoded-run finder: full decision {x:.2f}x as fast as with the reference finder (p50)")
    elif not decoders.NATIVE_AVAILABLE:
        lines.append("   native encoded-run finder not built: every case used the pure-Python reference")
    if PYTHON in result.stats:
        ratio = result.stats[PYTHON].vs_full
        lines.append(f"   baseline: the documented slow engine takes {ratio:.0f}x the Hyperscan full decision's p50")
    return "\n".join(lines)


@contextlib.contextmanager
def pinned_to_one_core() -> Iterator[str]:
    """Pin this process to one core (core 1 if available) for the in-process part and
    restore the previous affinity afterwards."""
    try:
        before = os.sched_getaffinity(0)
    except (AttributeError, OSError) as exc:
        yield f"not applied (no sched_setaffinity: {exc})"
        return
    core = 1 if 1 in before else max(before)
    os.sched_setaffinity(0, {core})
    try:
        yield f"this process on core {core} (sched_setaffinity)"
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def start_up_objects_frozen() -> Iterator[None]:
    """As `wiregate serve` does once started: everything loaded so far (modules, compiled
    databases, the runtime) lives for the whole process, so the cyclic collector skips it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class InProcess:
    engines: Engines
    sizes: list[SizeResult]


def run_in_process(sizes: Sequence[Size]) -> InProcess:
    values = wire_bench.secret_values(SECRET_COUNT)
    engines = compile_engines(values)
    print(
        f"  engine: {engines.format_rules} catalogue rules (detectors off) + {SECRET_COUNT:,} "
        f"secret values ({engines.literal_forms:,} byte forms)"
    )
    print(
        f"  compile: {engines.formats_s + engines.compile_s:.3f} s (catalogue load "
        f"{engines.formats_s:.3f} s, Hyperscan database {engines.compile_s:.3f} s)\n",
        flush=True,
    )
    results = []
    with check_setup(values) as setup, start_up_objects_frozen():
        for size in sizes:
            raw = agent_request(size.target_bytes)
            payload = Payload(size, raw, CARRIER.parse_request(raw, LIMITS))
            validate(payload, engines, setup)
            samples = measure_cases(cases(payload, engines, setup))
            results.append(SizeResult(payload, summarize(samples, len(raw))))
            print(format_size_table(results[-1]), flush=True)
            print(hyperscan_ceiling(engines.hyperscan, payload) + "\n", flush=True)
    return InProcess(engines, results)


def hyperscan_ceiling(engine: Engine, payload: Payload) -> str:
    """Hyperscan alone over exactly the passes one full decision of `payload` makes (the raw
    body, the decoded units, their normalised, squeezed, decoded and joined forms: what the
    evasion defences scan), timed scan by scan with a no-op callback: the fastest any full
    decision making these passes can be, whatever else it does. Reads the matcher's
    databases directly (a measuring instrument, not an interface)."""
    matcher = engine.matcher
    if not isinstance(matcher, HyperscanMatcher):
        return "   (no Hyperscan matcher)"
    passes: list[tuple[Any, str, bytes]] = []
    full, literals = matcher.scan, matcher.scan_literals

    def note_full(data: bytes) -> Any:
        passes.append((matcher._db, "scratch", data))
        return full(data)

    def note_literals(data: bytes) -> Any:
        passes.append((matcher._literal_db, "literal_scratch", data))
        return literals(data)

    matcher.scan, matcher.scan_literals = note_full, note_literals  # type: ignore[method-assign]
    try:
        engine.inspect(subject_of(payload.raw, payload.parsed))
    finally:
        del matcher.scan, matcher.scan_literals  # back to the class's methods

    def no_op(*_: Any) -> bool:
        return False

    def once() -> float:
        start = time.perf_counter()
        for db, which, data in passes:
            if db is not None and data:
                db.scan(data, match_event_handler=no_op, scratch=matcher._scratch(which, db))
        return time.perf_counter() - start

    for _ in range(5):
        once()
    seconds = statistics.median(once() for _ in range(30))
    n_full = sum(1 for db, _, _ in passes if db is matcher._db)
    full_bytes = sum(len(d) for db, _, d in passes if db is matcher._db)
    lit_bytes = sum(len(d) for db, _, d in passes if db is not matcher._db)
    size = len(payload.raw)
    return (
        f"   Hyperscan alone over one decision's passes: {n_full} full-database passes ({full_bytes:,} B) + "
        f"{len(passes) - n_full} literal-only ({lit_bytes:,} B) = {seconds * 1000:.3f} ms, "
        f"{size / seconds / MB:,.0f} MB/s of body: the ceiling of a full decision making these passes"
    )


# --- over the wire ---------------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    pinning: str
    result: WorkloadResult
    stats: dict[str, Stats]


def run_wire(quick: bool) -> Wire:
    """The wire benchmark's 200 KB workload, gateway configured with 1,000 secret values."""
    pinning = wire_bench.pin_client()
    print(
        f"Over the wire: {WIRE_WORKLOAD}, gateway with {SECRET_COUNT:,} secret values; pinning {pinning.describe()}",
        flush=True,
    )
    plan = [w for w in wire_bench.workloads(quick) if w.name == WIRE_WORKLOAD]
    rounds = 2 if quick else 5  # the wire benchmark's defaults
    with wire_bench.running_stack(SECRET_COUNT, pinning) as stack:
        [result] = asyncio.run(wire_bench.measure(stack, plan, rounds))
    return Wire(pinning.describe(), result, wire_bench.summarize(result))


# --- targets, report, main -------------------------------------------------------------


def target_checks(sizes: Sequence[SizeResult]) -> list[Check]:
    """The issue's two targets, on the full decision (parse + inspect, raw + decoded)."""
    out = []
    for result in sizes:
        if result.payload.size.target_bytes >= THROUGHPUT_TARGET_MIN_BYTES:
            mbps = result.stats[FULL].mbps_p50
            out.append(
                Check(
                    f"full decision (raw + decoded) >= {THROUGHPUT_TARGET_MBPS:g} MB/s",
                    result.payload.size.label,
                    f"{mbps:,.0f} MB/s",
                    mbps >= THROUGHPUT_TARGET_MBPS,
                )
            )
    for result in sizes:
        if result.payload.size.label == P50_TARGET_SIZE:
            p50 = result.stats[FULL].p50_ms
            out.append(
                Check(
                    f"full decision p50 <= {P50_TARGET_MS:g} ms", P50_TARGET_SIZE, f"{p50:.3f} ms", p50 <= P50_TARGET_MS
                )
            )
    return out


def machine_info(pinning: str) -> dict[str, Any]:
    wire_info = wire_bench.machine_info(wire_bench.Pinning(False, "-"), SECRET_COUNT)
    return {key: wire_info[key] for key in ("nproc", "cpu_model", "python")} | {
        "hyperscan": metadata.version("hyperscan"),
        "pinning": pinning,
        "secret_values": SECRET_COUNT,
        "native_json_reader": jsonraw.NATIVE_AVAILABLE,
    }


def write_json(
    path: Path, info: dict[str, Any], in_process: InProcess, wire: Wire, checks_: list[Check], errors: int
) -> None:
    engines = in_process.engines
    document = {
        "machine": info,
        "engine": {
            "format_rules": engines.format_rules,
            "secret_values": SECRET_COUNT,
            "literal_forms": engines.literal_forms,
            "catalogue_load_s": engines.formats_s,
            "compile_s": engines.compile_s,
        },
        "in_process": [r.as_json() for r in in_process.sizes],
        "wire": {
            "workload": WIRE_WORKLOAD,
            "body_bytes": len(wire.result.workload.body),
            "rounds": wire.result.rounds,
            "pinning": wire.pinning,
            "targets": {name: vars(s) for name, s in wire.stats.items()},
        },
        "checks": [vars(c) for c in checks_],
        "errors": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, ~10 s")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    return parser.parse_args(argv)


@wire_bench.bench_main("inspect_bench")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wire_bench.exit_on_sigterm()  # the wire part's subprocesses are stopped on SIGTERM too
    started = time.monotonic()
    try:
        with pinned_to_one_core() as pinning:
            info = machine_info(pinning) | {"quick": args.quick}
            print("wiregate inspection benchmark")
            print(f"  machine: {info['nproc']} CPUs, {info['cpu_model']}")
            print(f"  python {info['python']}, hyperscan {info['hyperscan']}")
            print(f"  pinning: {pinning}")
            in_process = run_in_process(QUICK_SIZES if args.quick else FULL_SIZES)
        wire = run_wire(args.quick)
    except NotAllowed as exc:
        print(f"inspect_bench: a benign payload was not allowed: {exc}", file=sys.stderr)
        return 1
    checks_ = target_checks(in_process.sizes)
    wire_bench.print_checks(checks_)
    print(f"\nTotal time {time.monotonic() - started:.0f} s")
    errors = wire_bench.print_errors([wire.result])
    if args.json:
        write_json(args.json, info, in_process, wire, checks_, errors)
        print(f"Results written to {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
