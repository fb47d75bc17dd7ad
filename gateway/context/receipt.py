"""The prepared-context Receipt (RFC 1435, COMPAT §7.1): build it, check every invariant, or omit it.

Owns: the receipt object `powercontext.prepared-context-receipt.v1` — digests, byte accounting,
retrieval rounds / search groups / rerank configs / rerank groups, selected identities in the
builder's exact origin order, omitted groups, stage timings — its limits (rounds ≤3, searches ≤32,
rerank configs ≤8, reranks ≤32, selected ≤32, omitted ≤16, stages ≤8, ≤8192 serialised bytes) and
the rule that any breach yields no receipt plus a content-free diagnostic code.
Must not: do I/O, generate ids or read clocks (the receipt id and timings are passed in), or ever put
content, the query or ids into a diagnostic. It never changes the prepared content.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import rfc8785

from gateway.context import builder
from gateway.context.builder import BuildResult
from gateway.context.content import compact_json, normalize_text
from gateway.context.model import ArtifactAddress

SCHEMA = "powercontext.prepared-context-receipt.v1"
POLICY_ID = SCHEMA
MAX_ROUNDS, MAX_SEARCHES, MAX_RERANK_CONFIGS, MAX_RERANKS = 3, 32, 8, 32
MAX_SELECTED, MAX_OMITTED, MAX_STAGES = 32, 16, 8
MAX_RECEIPT_BYTES = 8192

ROUND_OUTCOMES = frozenset({"completed", "expansion_failed"})
SEARCH_MODES = frozenset({"fts", "vector", "hybrid", "snapshot", "code", "none"})
SEARCH_OUTCOMES = frozenset({"completed", "not_run", "failed"})
FALLBACK_REASONS = frozenset({"none", "inference_unavailable", "inference_timeout", "reused_fts_fallback"})
RERANK_OUTCOMES = frozenset({"selected", "fallback", "failed"})
RERANK_FALLBACKS = frozenset(
    {"none", "empty_selection", "inference_unavailable", "inference_timeout", "invalid_output"}
)
KINDS = frozenset({"atomic-memory", "topic-memory", "experience", "profile", "code"})
FAMILIES = frozenset({"atomic-memory", "topic-memory", "experience", "profile", "code"})
STAGES = frozenset(
    {
        "scope.authorize",
        "query.embed",
        "memory.search",
        "topic-memory.search",
        "experience.search",
        "rerank",
        "context.build",
    }
)
# Versioned allow-list of rerank settings a receipt may disclose, per rerank policy.
RERANK_SETTINGS_ALLOWED: Mapping[str, frozenset[str]] = {
    "powercontext.memory.rerank.listwise.v1": frozenset({"temperature", "candidate_limit", "max_output_tokens"}),
    "wiregate.memory.rerank.coverage.v1": frozenset({"candidate_limit", "min_share"}),  # context/rerank.py
}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True, slots=True)
class RecallRound:
    round: int
    outcome: str
    retained: int


@dataclass(frozen=True, slots=True, order=True)
class SearchGroup:
    round: int
    family: str
    mode: str
    outcome: str
    fallback_reason: str
    count: int


@dataclass(frozen=True, slots=True)
class RerankConfig:
    policy_id: str
    model: str
    effective_settings: Mapping[str, Any]
    timeout_seconds: float
    max_requests: int
    prompt: Mapping[str, Any]
    non_deterministic: bool

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "policy_id": self.policy_id,
            "model": self.model,
            "effective_settings": dict(self.effective_settings),
            "timeout_seconds": self.timeout_seconds,
            "max_requests": self.max_requests,
            "prompt": dict(self.prompt),
            "non_deterministic": self.non_deterministic,
        }
        digest = "sha256:" + hashlib.sha256(rfc8785.dumps(rec)).hexdigest()
        return {"config_id": digest, **rec, "config_digest": digest}


@dataclass(frozen=True, slots=True, order=True)
class RerankGroup:
    round: int
    config_id: str
    outcome: str
    fallback_reason: str
    count: int


@dataclass(frozen=True, slots=True)
class StageTiming:
    stage: str
    duration_ms: float
    count: int


@dataclass(frozen=True, slots=True)
class ReceiptInput:
    receipt_id: str  # a UUID chosen by the caller
    query: str
    requested_max_bytes: int
    built: BuildResult
    origins: Sequence[ArtifactAddress]  # what the service collected as dependencies, in order
    rounds: Sequence[RecallRound]
    searches: Sequence[SearchGroup]
    stages: Sequence[StageTiming]
    rerank_configs: Sequence[RerankConfig] = ()
    reranks: Sequence[RerankGroup] = ()
    non_deterministic: bool = False


@dataclass(frozen=True, slots=True)
class ReceiptOutcome:
    receipt: dict[str, Any] | None
    diagnostic: str | None = field(default=None)  # content-free code when the receipt was omitted


class _Breach(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _require(ok: bool, code: str) -> None:
    if not ok:
        raise _Breach(code)


def query_digest(query: str) -> str:
    """sha256 of the UTF-8 of NFC(query).strip(); no byte cap applies."""
    return "sha256:" + hashlib.sha256(normalize_text(query).encode("utf-8")).hexdigest()


def build_receipt(inp: ReceiptInput) -> ReceiptOutcome:
    try:
        return ReceiptOutcome(_build(inp))
    except _Breach as breach:
        return ReceiptOutcome(None, breach.code)
    except (ValueError, TypeError, KeyError, UnicodeError):
        return ReceiptOutcome(None, "receipt_malformed_input")


def _build(inp: ReceiptInput) -> dict[str, Any]:
    built = inp.built
    _require(isinstance(inp.receipt_id, str) and bool(_UUID.match(inp.receipt_id)), "receipt_id_invalid")
    _require(512 <= inp.requested_max_bytes <= 32768, "receipt_max_bytes_invalid")
    _require(bool(normalize_text(inp.query)), "receipt_query_blank")

    # content and byte accounting
    if built.content is None:
        _require(built.content_bytes == 0 and not built.items, "receipt_empty_inconsistent")
        content_digest = None
    else:
        raw = built.content.encode("utf-8")
        _require(len(raw) == built.content_bytes, "receipt_used_bytes_mismatch")
        _require(bool(built.content.strip()) and bool(built.items), "receipt_ready_inconsistent")
        fragments = sum(i.rendered_bytes for i in built.items) + len(built.items) - 1
        _require(len(builder.render([]).encode("utf-8")) + fragments == len(raw), "receipt_fragment_bytes_mismatch")
        content_digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    _require(built.content_bytes <= inp.requested_max_bytes, "receipt_over_budget")

    # selected: one identity each, exactly the builder's origins in order
    _require(len(built.items) <= MAX_SELECTED, "receipt_selected_limit")
    _require([i.address for i in built.items] == list(inp.origins), "receipt_selected_order")
    selected: list[dict[str, Any]] = []
    for item in built.items:
        _require(item.kind in KINDS and item.kind == item.address.artifact.family, "receipt_selected_kind")
        _require(item.rendered_bytes > 0, "receipt_selected_bytes")
        selected.append(
            {
                "kind": item.kind,
                "artifact_address": item.address.to_wire(),
                "rendered_bytes": item.rendered_bytes,
                "truncated": item.truncated,
            }
        )
    _require(all(len(s.keys() & {"artifact_address", "code_evidence"}) == 1 for s in selected), "receipt_identity")
    truncated = built.truncated_items > 0 or built.dropped_items > 0
    _require(truncated or not any(i.truncated for i in built.items), "receipt_truncated_inconsistent")
    _require(built.truncated_items == sum(1 for i in built.items if i.truncated), "receipt_truncated_count")

    # retrieval
    rounds = list(inp.rounds)
    _require(1 <= len(rounds) <= MAX_ROUNDS, "receipt_rounds_limit")
    _require([r.round for r in rounds] == list(range(len(rounds))), "receipt_rounds_order")
    _require(all(r.outcome in ROUND_OUTCOMES and r.retained >= 0 for r in rounds), "receipt_round_invalid")
    searches = sorted(inp.searches)
    _require(len(searches) <= MAX_SEARCHES, "receipt_searches_limit")
    _require(len(set(searches)) == len(searches), "receipt_search_duplicate")
    for s in searches:
        _require(0 <= s.round < len(rounds), "receipt_search_round")
        _require(s.family in FAMILIES and s.mode in SEARCH_MODES, "receipt_search_mode")
        _require(s.outcome in SEARCH_OUTCOMES and s.fallback_reason in FALLBACK_REASONS, "receipt_search_outcome")
        _require(s.count > 0, "receipt_search_count")
    configs = [c.record() for c in inp.rerank_configs]
    _require(len(configs) <= MAX_RERANK_CONFIGS, "receipt_rerank_configs_limit")
    for c in configs:
        allowed = RERANK_SETTINGS_ALLOWED.get(c["policy_id"])
        _require(allowed is not None and set(c["effective_settings"]) <= allowed, "receipt_rerank_settings")
    config_ids = {c["config_id"] for c in configs}
    _require(len(config_ids) == len(configs), "receipt_rerank_config_duplicate")
    reranks = sorted(inp.reranks)
    _require(len(reranks) <= MAX_RERANKS, "receipt_reranks_limit")
    for g in reranks:
        _require(g.config_id in config_ids and 0 <= g.round < len(rounds), "receipt_rerank_reference")
        _require(g.outcome in RERANK_OUTCOMES and g.fallback_reason in RERANK_FALLBACKS, "receipt_rerank_outcome")
        _require(g.count > 0, "receipt_rerank_count")

    # omitted and stages
    omitted = list(built.omitted)
    _require(len(omitted) <= MAX_OMITTED, "receipt_omitted_limit")
    for o in omitted:
        _require(o.family in FAMILIES and o.reason in builder.REASONS and o.count > 0, "receipt_omitted_invalid")
        _require(o.reason != "not_retrieved" or o.count == 1, "receipt_not_retrieved_count")
    drop = {r: sum(o.count for o in omitted if o.reason == r) for r in ("below_min_bytes", "no_fitting_truncation")}
    _require(drop["below_min_bytes"] == built.below_min_bytes, "receipt_drop_counter")
    _require(drop["no_fitting_truncation"] == built.no_fitting_truncation, "receipt_drop_counter")
    stages = list(inp.stages)
    _require(len(stages) <= MAX_STAGES, "receipt_stages_limit")
    for st in stages:
        _require(st.stage in STAGES and st.duration_ms >= 0 and st.count >= 0, "receipt_stage_invalid")

    receipt: dict[str, Any] = {
        "schema": SCHEMA,
        "policy_id": POLICY_ID,
        "receipt_id": inp.receipt_id,
        "query_digest": query_digest(inp.query),
        "content_digest": content_digest,
        "requested_max_bytes": inp.requested_max_bytes,
        "used_bytes": built.content_bytes,
        "truncated": truncated,
        "non_deterministic": inp.non_deterministic,
        "retrieval": {
            "rounds": [{"round": r.round, "outcome": r.outcome, "retained": r.retained} for r in rounds],
            "searches": [
                {
                    "round": s.round,
                    "family": s.family,
                    "mode": s.mode,
                    "outcome": s.outcome,
                    "fallback_reason": s.fallback_reason,
                    "count": s.count,
                }
                for s in searches
            ],
            "rerank_configs": configs,
            "reranks": [
                {
                    "round": g.round,
                    "config_id": g.config_id,
                    "outcome": g.outcome,
                    "fallback_reason": g.fallback_reason,
                    "count": g.count,
                }
                for g in reranks
            ],
        },
        "selected": selected,
        "omitted": [{"family": o.family, "reason": o.reason, "count": o.count} for o in omitted],
        "stages": [{"stage": st.stage, "duration_ms": round(st.duration_ms, 3), "count": st.count} for st in stages],
    }
    _require(len(serialize(receipt)) <= MAX_RECEIPT_BYTES, "receipt_too_large")
    return receipt


def serialize(receipt: Mapping[str, Any]) -> bytes:
    """The receipt as compact JSON bytes — the form its size limit is measured on."""
    return compact_json(receipt)
