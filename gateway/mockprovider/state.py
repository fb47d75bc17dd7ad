"""Mock-provider state: scenario steps, request records and the thread-safe `MockState`.

This module owns everything a test controls or inspects:

* `Step` / `ToolCallSpec` -- one validated answer recipe (status, text, tool calls,
  timing, faults) parsed from the JSON a test registers;
* scenario bookkeeping -- steps are consumed in order, the last one repeats forever;
* `RequestRecord` -- what the mock received for every ``/v1`` request and how the
  answer went (status, finished, cancelled);
* `MockState` -- the lock-protected container shared by the aiohttp app (running in
  its own thread) and the test code (any thread), including the prompt-cache store and
  its knobs (minimum cacheable prefixes, OpenAI TTL, the replaceable clock).

Nothing here does I/O except `MockState.wait_for`, which polls.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cache import (
    DEFAULT_CACHE_MIN_TOKENS,
    DEFAULT_OPENAI_CACHE_MIN_TOKENS,
    DEFAULT_OPENAI_CACHE_TTL_S,
    TTL_SECONDS,
    AnthropicCacheQuery,
    CacheStore,
    CacheUsage,
    PromptPrefixes,
    lookback_positions,
    openai_cached_tokens,
    plan_anthropic,
)

SCENARIO_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""Allowed scenario ids."""

_SCENARIO_ID_RE = re.compile(SCENARIO_ID_PATTERN)
_SCENARIO_MARKER_RE = re.compile(rb"mock-scenario:(" + SCENARIO_ID_PATTERN.encode() + rb")")

FAULTS = frozenset({"reset_before_headers", "reset_mid_stream", "truncated_json", "hang", "hang_after_headers"})
"""Values accepted in `Step.fault`."""

_POLL_INTERVAL_S = 0.005
_CACHE_SWEEP_INTERVAL_S = 60.0


class StepError(ValueError):
    """A scenario or step definition is invalid (reported as HTTP 400 by the admin API)."""


def find_scenario_marker(body: bytes) -> str | None:
    """Return X for the first ``mock-scenario:X`` found anywhere in the raw body."""
    match = _SCENARIO_MARKER_RE.search(body)
    return match.group(1).decode("ascii") if match else None


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call the mock emits; `arguments` is sent byte-exactly."""

    name: str
    arguments: str
    chunks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Step:
    """One answer recipe.  All fields optional; the defaults give a plain success.

    * ``status`` -- non-2xx gives a provider-shaped error body (``error_message``
      overrides its message); ``headers`` are added to any response.
    * ``text`` / ``chunks`` -- assistant text, split into ``chunk_size`` characters per
      stream event or exactly into ``chunks``; ``tool_calls`` -- emitted after the text
      (text then defaults to "").  ``omit_usage`` drops usage.
    * ``delay_ms`` before headers, ``drip_ms`` between stream events, ``split_bytes``
      caps each socket write (the body is written in pieces of at most that size).
    * ``fault`` -- one of `FAULTS`.
    * ``raw_body`` / ``raw_events`` -- send these exact bytes (a body, or SSE events)
      instead of anything generated; ``content_type`` overrides the default type.
    * ``text_field`` -- where a stream carries the text, for the shapes servers emit
      besides the usual one: chat ``content`` (default), ``reasoning``,
      ``reasoning_content``, ``refusal``, ``audio.transcript`` or legacy
      ``function_call.arguments``; Anthropic ``text`` (default) or ``thinking``;
      Responses ``output_text`` (default) or any other event family (``<family>.delta``
      events, e.g. ``reasoning_summary_text``).
    * ``start_text_chars`` -- Anthropic streams: this many leading characters of the text
      travel in ``content_block_start`` rather than in deltas.
    """

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    error_message: str | None = None
    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    chunk_size: int = 8
    chunks: tuple[str, ...] | None = None
    omit_usage: bool = False
    delay_ms: float = 0.0
    drip_ms: float = 0.0
    split_bytes: int | None = None
    fault: str | None = None
    raw_body: str | None = None
    content_type: str | None = None
    raw_events: tuple[str, ...] | None = None
    text_field: str | None = None
    start_text_chars: int = 0

    @property
    def is_error(self) -> bool:
        return not 200 <= self.status < 300

    @classmethod
    def from_json(cls, data: object) -> Step:
        """Validate a step as registered through JSON (unknown fields are rejected)."""
        if not isinstance(data, dict):
            raise StepError("a step must be a JSON object")
        unknown = set(data) - _STEP_FIELDS
        if unknown:
            raise StepError(f"unknown step field(s): {', '.join(sorted(unknown))}")
        return _parse_step(data)


_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(Step))


def _expect(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass; never accept it where a number is expected.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise StepError(f"step field {name!r} has the wrong type")
    return value


def _expect_str_list(data: Mapping[str, Any], name: str) -> tuple[str, ...] | None:
    value = _expect(data, name, list)
    if value is None:
        return None
    if not all(isinstance(item, str) for item in value):
        raise StepError(f"step field {name!r} must be a list of strings")
    return tuple(value)


def _expect_non_negative(data: Mapping[str, Any], name: str) -> float:
    value = _expect(data, name, (int, float))
    if value is None:
        return 0.0
    if value < 0:
        raise StepError(f"step field {name!r} must be >= 0")
    return float(value)


def _expect_positive_int(data: Mapping[str, Any], name: str) -> int | None:
    value = _expect(data, name, int)
    if value is not None and value < 1:
        raise StepError(f"step field {name!r} must be >= 1")
    return value  # type: ignore[no-any-return]


def _joined(pieces: tuple[str, ...] | None, whole: str | None, what: str) -> str | None:
    """Reconcile an explicit piece list with the whole string it must add up to."""
    if pieces is None:
        return whole
    joined = "".join(pieces)
    if whole is not None and whole != joined:
        raise StepError(f"{what}: the chunks do not join to the full string")
    return joined


def _parse_tool_call(data: object) -> ToolCallSpec:
    if not isinstance(data, dict):
        raise StepError("each tool call must be a JSON object")
    unknown = set(data) - {"name", "arguments", "chunks"}
    if unknown:
        raise StepError(f"unknown tool call field(s): {', '.join(sorted(unknown))}")
    name = _expect(data, "name", str)
    if not name:
        raise StepError("a tool call needs a non-empty 'name'")
    chunks = _expect_str_list(data, "chunks")
    arguments = _joined(chunks, _expect(data, "arguments", str), f"tool call {name!r}")
    return ToolCallSpec(name=name, arguments=arguments or "", chunks=chunks)


def _parse_headers(data: Mapping[str, Any]) -> dict[str, str]:
    headers = _expect(data, "headers", dict) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise StepError("step field 'headers' must map strings to strings")
    return dict(headers)


def _parse_step(data: Mapping[str, Any]) -> Step:
    status = _expect(data, "status", int)
    if status is not None and not 200 <= status <= 999:  # 600-999: what a broken provider may send
        raise StepError("step field 'status' must be between 200 and 999")
    fault = _expect(data, "fault", str)
    if fault is not None and fault not in FAULTS:
        raise StepError(f"unknown fault {fault!r}; expected one of {sorted(FAULTS)}")
    chunks = _expect_str_list(data, "chunks")
    tool_calls = tuple(_parse_tool_call(item) for item in _expect(data, "tool_calls", list) or [])
    return Step(
        status=200 if status is None else status,
        headers=_parse_headers(data),
        error_message=_expect(data, "error_message", str),
        text=_joined(chunks, _expect(data, "text", str), "step text"),
        tool_calls=tool_calls,
        chunk_size=_expect_positive_int(data, "chunk_size") or 8,
        chunks=chunks,
        omit_usage=bool(_expect(data, "omit_usage", bool)),
        delay_ms=_expect_non_negative(data, "delay_ms"),
        drip_ms=_expect_non_negative(data, "drip_ms"),
        split_bytes=_expect_positive_int(data, "split_bytes"),
        fault=fault,
        raw_body=_expect(data, "raw_body", str),
        content_type=_expect(data, "content_type", str),
        raw_events=_expect_str_list(data, "raw_events"),
        text_field=_text_field(data),
        start_text_chars=int(_expect_non_negative(data, "start_text_chars")),
    )


_TEXT_FIELD_RE = re.compile(r"[a-z_]{1,40}(\.[a-z_]{1,40})?")


def _text_field(data: Mapping[str, Any]) -> str | None:
    value = _expect(data, "text_field", str)
    if value is not None and not _TEXT_FIELD_RE.fullmatch(value):
        raise StepError("step field 'text_field' must be a field name or a dotted pair of them")
    return value  # type: ignore[no-any-return]


def parse_steps(steps: object) -> list[Step]:
    """Validate a scenario's step list (`Step` objects or their JSON form)."""
    if not isinstance(steps, list | tuple) or not steps:
        raise StepError("'steps' must be a non-empty list")
    return [step if isinstance(step, Step) else Step.from_json(step) for step in steps]


def validate_scenario_id(scenario_id: object) -> str:
    if not isinstance(scenario_id, str) or not _SCENARIO_ID_RE.fullmatch(scenario_id):
        raise StepError(f"scenario id must match {SCENARIO_ID_PATTERN}")
    return scenario_id


@dataclass
class RequestRecord:
    """What the mock received for one ``/v1`` request, and how answering it went.

    `headers` maps lower-cased names to the values as received; `body` is the exact
    bytes and `json` their parse (None if not JSON); `query` the raw query string.
    `status` is set when the response headers are sent (None while delayed or hung);
    `last_write_at` (monotonic, like `started`) just before each write of response
    bytes, so it ends as the start of the final write; `finished` once the whole
    response was written; `cancelled` when the client went away or the server
    stopped before that.
    """

    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    json: Any
    scenario: str | None
    started: float
    status: int | None = None
    last_write_at: float | None = None
    finished: bool = False
    cancelled: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON-safe view used by ``GET /_mock/requests``."""
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body.decode("utf-8", errors="replace"),
            "body_b64": base64.b64encode(self.body).decode("ascii"),
            "json": self.json,
            "scenario": self.scenario,
            "started": self.started,
            "status": self.status,
            "last_write_at": self.last_write_at,
            "finished": self.finished,
            "cancelled": self.cancelled,
        }


RecordsPredicate = Callable[[list[RequestRecord]], bool]
Clock = Callable[[], float]


def _non_negative_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    return value


def _positive_seconds(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0")
    return float(value)


TIME_SCALE_ENV = "WIREGATE_MOCK_TIME_SCALE"


def scaled_clock(scale: float, base: Clock = time.monotonic) -> Clock:
    """A clock that runs `scale` times faster than `base` (from when it is made)."""
    scale = _positive_seconds(scale, "time_scale")
    origin = base()
    return lambda: origin + (base() - origin) * scale


def time_scale_from_env() -> float:
    """`WIREGATE_MOCK_TIME_SCALE` (default 1: real time)."""
    return _positive_seconds(float(os.environ.get(TIME_SCALE_ENV, "1")), TIME_SCALE_ENV)


class MockState:
    """Scenarios, request records, the prompt cache and settings shared by the app and
    test code.

    Every public method is thread-safe: the aiohttp app runs in its own thread
    (see `MockProviderServer`) while tests call in from theirs.

    Prompt-cache knobs (see `cache` for the rules): `cache_min_tokens` (Anthropic
    minimum cacheable prefix), `openai_cache_min_tokens`, `openai_cache_ttl_s`, and
    `clock` -- the time source of cache expiry (`time.monotonic` by default; a test
    may assign e.g. ``state.clock = lambda: t``), and `time_scale` -- cache time
    passes that many times faster than real time (60: one second is one minute, so a
    session minutes apart replays in seconds).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
        openai_cache_min_tokens: int = DEFAULT_OPENAI_CACHE_MIN_TOKENS,
        openai_cache_ttl_s: float = DEFAULT_OPENAI_CACHE_TTL_S,
        clock: Clock = time.monotonic,
        time_scale: float = 1.0,
    ) -> None:
        self._lock = threading.Lock()
        self._scenarios: dict[str, list[Step]] = {}
        self._records: list[RequestRecord] = []
        self._by_seq: dict[int, RequestRecord] = {}
        self._next_seq = 1
        self._api_key = api_key
        self._cache_min_tokens = _non_negative_int(cache_min_tokens, "cache_min_tokens")
        self._openai_cache_min_tokens = _non_negative_int(openai_cache_min_tokens, "openai_cache_min_tokens")
        self._openai_cache_ttl_s = _positive_seconds(openai_cache_ttl_s, "openai_cache_ttl_s")
        self.clock: Clock = clock if time_scale == 1.0 else scaled_clock(time_scale, clock)
        self._cache = CacheStore()
        self._next_sweep: float | None = None

    # -- settings ---------------------------------------------------------------

    @property
    def api_key(self) -> str | None:
        """Required key (Bearer for OpenAI routes, x-api-key for Anthropic); None = open."""
        with self._lock:
            return self._api_key

    @api_key.setter
    def api_key(self, value: str | None) -> None:
        with self._lock:
            self._api_key = value

    @property
    def cache_min_tokens(self) -> int:
        """Anthropic: a breakpoint whose prefix has fewer tokens is silently not cached."""
        with self._lock:
            return self._cache_min_tokens

    @cache_min_tokens.setter
    def cache_min_tokens(self, value: int) -> None:
        value = _non_negative_int(value, "cache_min_tokens")
        with self._lock:
            self._cache_min_tokens = value

    @property
    def openai_cache_min_tokens(self) -> int:
        """OpenAI: a stored prefix shorter than this is not reported as cached."""
        with self._lock:
            return self._openai_cache_min_tokens

    @openai_cache_min_tokens.setter
    def openai_cache_min_tokens(self, value: int) -> None:
        value = _non_negative_int(value, "openai_cache_min_tokens")
        with self._lock:
            self._openai_cache_min_tokens = value

    @property
    def openai_cache_ttl_s(self) -> float:
        """OpenAI: lifetime of a cached prefix, renewed whenever a request contains it."""
        with self._lock:
            return self._openai_cache_ttl_s

    @openai_cache_ttl_s.setter
    def openai_cache_ttl_s(self, value: float) -> None:
        value = _positive_seconds(value, "openai_cache_ttl_s")
        with self._lock:
            self._openai_cache_ttl_s = value

    def now(self) -> float:
        """The cache clock (`clock`), in seconds."""
        return self.clock()

    # -- prompt cache -----------------------------------------------------------

    def anthropic_cache(self, query: AnthropicCacheQuery) -> CacheUsage:
        """Read and write the cache for one Anthropic request; return what to bill.

        Reads only see entries written by earlier requests; the entry read is
        refreshed, and every breakpoint after it is written with its own TTL.
        """
        hashes = query.prefixes.hashes
        now = self.now()
        with self._lock:
            self._sweep_if_due(now)
            live = frozenset(
                position
                for position in lookback_positions(query.breakpoints)
                if self._cache.is_live(hashes[position], now)
            )
            plan = plan_anthropic(query.prefixes.tokens, query.breakpoints, live, self._cache_min_tokens)
            if plan.read_position is not None:
                self._cache.refresh(hashes[plan.read_position], now)
            for write in plan.writes:
                self._cache.put(hashes[write.position], TTL_SECONDS[write.ttl], now)
            return plan.usage

    def openai_cache(self, prefixes: PromptPrefixes) -> CacheUsage:
        """Look up the longest stored prefix of one OpenAI request, then store (or renew)
        every prefix of it; return the cached tokens to report (no write charge)."""
        now = self.now()
        with self._lock:
            self._sweep_if_due(now)
            hit = next(
                (
                    prefixes.tokens[position]
                    for position in reversed(range(len(prefixes.hashes)))
                    if self._cache.is_live(prefixes.hashes[position], now)
                ),
                0,
            )
            for key in prefixes.hashes:
                self._cache.put(key, self._openai_cache_ttl_s, now)
            return CacheUsage(read_tokens=openai_cached_tokens(hit, self._openai_cache_min_tokens))

    def clear_cache(self) -> int:
        """Forget every prompt-cache entry; return how many there were."""
        with self._lock:
            return self._cache.clear()

    def cache_entries(self) -> int:
        """How many prompt-cache entries are stored (expired ones may linger a while)."""
        with self._lock:
            return len(self._cache)

    def _sweep_if_due(self, now: float) -> None:
        """Drop expired entries about once a minute of cache time (caller holds the lock);
        a clock that jumped backwards restarts the schedule."""
        due = self._next_sweep
        if due is None or now >= due or now < due - _CACHE_SWEEP_INTERVAL_S:
            self._cache.sweep(now)
            self._next_sweep = now + _CACHE_SWEEP_INTERVAL_S

    # -- scenarios --------------------------------------------------------------

    def add_scenario(self, scenario_id: str, steps: Sequence[Step | Mapping[str, Any]]) -> None:
        """Register (or replace, restarting at step 1) scenario `scenario_id`."""
        parsed = parse_steps(list(steps))
        validate_scenario_id(scenario_id)
        with self._lock:
            self._scenarios[scenario_id] = parsed

    def remove_scenarios(self) -> None:
        with self._lock:
            self._scenarios.clear()

    def next_step(self, scenario_id: str | None) -> Step | None:
        """Consume the scenario's next step; the last one repeats.  None = unknown id."""
        if scenario_id is None:
            return Step()
        with self._lock:
            steps = self._scenarios.get(scenario_id)
            if steps is None:
                return None
            return steps.pop(0) if len(steps) > 1 else steps[0]

    # -- records ----------------------------------------------------------------

    def open_record(
        self,
        *,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        parsed: Any,
        scenario: str | None,
    ) -> int:
        """Store a new record (before the request is answered); return its seq."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            record = RequestRecord(
                seq=seq,
                method=method,
                path=path,
                query=query,
                headers=headers,
                body=body,
                json=parsed,
                scenario=scenario,
                started=time.monotonic(),
            )
            self._records.append(record)
            self._by_seq[seq] = record
            return seq

    def update_record(self, seq: int, **changes: Any) -> None:
        """Set `status` / `last_write_at` / `finished` / `cancelled` (no-op if cleared)."""
        with self._lock:
            record = self._by_seq.get(seq)
            if record is not None:
                for name, value in changes.items():
                    setattr(record, name, value)

    def records(self) -> list[RequestRecord]:
        """Copies of all records, oldest first (safe to keep while requests continue)."""
        with self._lock:
            return [dataclasses.replace(record, headers=dict(record.headers)) for record in self._records]

    def clear(self) -> int:
        """Forget all records (sequence numbers keep increasing); return how many."""
        with self._lock:
            count = len(self._records)
            self._records.clear()
            self._by_seq.clear()
            return count

    def wait_for(self, predicate: RecordsPredicate, timeout: float) -> bool:
        """Block (polling) until `predicate(records())` is true; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self.records()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_INTERVAL_S)

    async def wait_for_async(
        self,
        predicate: RecordsPredicate,
        timeout: float,  # noqa: ASYNC109 - same signature as wait_for on purpose
    ) -> bool:
        """Like `wait_for` but yields to the running event loop while polling."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self.records()):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_INTERVAL_S)
