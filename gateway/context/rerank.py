"""The optional deterministic reranker of prepare's candidate pools (SPEC §10.2). PURE.

Owns: the `coverage` rerank policy (`wiregate.memory.rerank.coverage.v1`) — its settings, the
RerankConfig record a receipt discloses for it, and the rule. The rule, per candidate pool (one
family of one scope, in its search order): the first `candidate_limit` candidates are judged by
how many distinct query terms their searchable text holds (analyzer v1, as search admits them);
those holding at least ⌈min_share · best⌉ of them are selected, most terms first and the search
order breaking ties; the others are removed (`rerank_not_selected`); candidates past the limit
are not judged and follow in their search order. When no judged candidate holds a query term
(a pool found by vectors alone) nothing is removed and the search order stands: outcome
`fallback`, `empty_selection` — as PowerContext falls back to its coarse ranks.
Must not: do I/O, call a model or read a clock; the same inputs give the same order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.context import search
from gateway.context.receipt import RerankConfig

POLICY_ID = "wiregate.memory.rerank.coverage.v1"
# What the policy is, stated once: its digest is the config's `compiled_digest`, so a change to
# the rule is a new version, visible in every receipt that records it.
DEFINITION = (
    "coverage.v1: judge the first candidate_limit candidates of each pool by the distinct query "
    "terms (analyzer v1) their searchable text holds; select those holding at least "
    "ceil(min_share * best), most first, search order breaking ties; keep the unjudged rest after "
    "them in search order; no judged candidate holding a term: keep the search order."
)
_COMPILED = "sha256:" + hashlib.sha256(DEFINITION.encode("utf-8")).hexdigest()

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RerankSettings:
    candidate_limit: int = 30  # judged candidates per pool (1..100, as PowerContext's listwise policy)
    min_share: float = 0.5  # of the best candidate's query terms a selected one must hold (0 < s <= 1)

    def __post_init__(self) -> None:
        if not 1 <= self.candidate_limit <= 100 or not 0.0 < self.min_share <= 1.0:
            raise ValueError("rerank settings out of range")

    def effective_settings(self) -> dict[str, int | float]:
        """The settings a receipt and the capabilities disclose (on the receipt's allow-list)."""
        return {"candidate_limit": self.candidate_limit, "min_share": self.min_share}

    def config(self, scope_id: str) -> RerankConfig:
        """The record a receipt discloses (its digest is the config id)."""
        return RerankConfig(
            policy_id=POLICY_ID,
            model="none",
            effective_settings=self.effective_settings(),
            timeout_seconds=0.0,
            max_requests=0,
            prompt={
                "scope_id": scope_id,
                "key": "memory.rerank",
                "definition_version": 1,
                "builtin_version": 1,
                "selection": "built_in",
                "selected_version": 1,
                "compiled_digest": _COMPILED,
                "artifact_address": None,
            },
            non_deterministic=False,
        )


@dataclass(frozen=True, slots=True)
class Reranked(Generic[T]):
    kept: tuple[T, ...]
    removed: int  # judged and not selected
    outcome: str  # selected | fallback
    fallback_reason: str  # none | empty_selection


def rerank(
    query_terms: Sequence[str], pool: Sequence[T], texts: Sequence[str], settings: RerankSettings
) -> Reranked[T]:
    """Rerank one pool; `texts[i]` is the searchable text of `pool[i]`."""
    if len(texts) != len(pool):
        raise ValueError("one text per candidate")
    judged = min(len(pool), settings.candidate_limit)
    held = [search.matched_terms(query_terms, texts[i]) for i in range(judged)]
    best = max(held, default=0)
    if best == 0:
        return Reranked(tuple(pool), 0, "fallback", "empty_selection")
    need = math.ceil(settings.min_share * best)  # >= 1: best >= 1 and min_share > 0
    chosen = sorted((i for i in range(judged) if held[i] >= need), key=lambda i: (-held[i], i))
    kept = tuple(pool[i] for i in chosen) + tuple(pool[judged:])
    return Reranked(kept, judged - len(chosen), "selected", "none")
