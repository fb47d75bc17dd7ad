"""Pure search logic: query analysis, lexical admission, vector admission, reciprocal rank fusion.

Owns: analyzer v1 (NFC, casefold, runs of letters/marks/digits, CJK unigrams + bigrams), the
lexical admission floor of COMPAT §3 (≤2 terms need 1 match, longer queries max(2, ⌈0.25·terms⌉)),
cosine admission (≥0.3 on unit vectors), RRF with k=60 whose ties break on identity bytes, and the
backend pool size rule max(4·coarse, 32).
Must not: do I/O, call an embedding provider, read a clock, or know about SQL.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

RRF_K = 60
MIN_COSINE = 0.3
MIN_POOL = 32


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2EBEF
        or 0xF900 <= cp <= 0xFAFF
        or 0x3040 <= cp <= 0x30FF
        or 0xAC00 <= cp <= 0xD7AF
        or 0x1100 <= cp <= 0x11FF
    )


def _is_token_char(ch: str) -> bool:
    # The same categories the SQLite FTS5 tokenizer is configured with ('L* N* M* Co').
    cat = unicodedata.category(ch)
    return cat[0] in "LNM" or cat == "Co"


_ASCII_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    """Analyzer v1: every token of `text` in order (duplicates kept)."""
    if text.isascii():  # fast path, same result: ASCII letters/digits are the only token characters there
        return _ASCII_TOKEN.findall(text.lower())
    folded = unicodedata.normalize("NFC", text).casefold()
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if not run:
            return
        segment: list[str] = []
        cjk: list[str] = []
        for ch in run:
            if _is_cjk(ch):
                if segment:
                    out.append("".join(segment))
                    segment = []
                cjk.append(ch)
            else:
                if cjk:
                    _cjk_grams(cjk, out)
                    cjk = []
                segment.append(ch)
        if segment:
            out.append("".join(segment))
        if cjk:
            _cjk_grams(cjk, out)
        run.clear()

    for ch in folded:
        if _is_token_char(ch):
            run.append(ch)
        else:
            flush()
    flush()
    return out


def _cjk_grams(chars: list[str], out: list[str]) -> None:
    out.extend(chars)
    out.extend(a + b for a, b in zip(chars, chars[1:], strict=False))


def token_spans(text: str) -> list[tuple[str, int, int]]:
    """`tokens(text)` with where each is: `(token, start, end)` over `NFC(text).casefold()`,
    in the same order (a CJK unigram covers one character, a bigram two)."""
    if text.isascii():  # NFC + casefold of ASCII is lower(): same offsets
        return [(m.group(), m.start(), m.end()) for m in _ASCII_TOKEN.finditer(text.lower())]
    folded = unicodedata.normalize("NFC", text).casefold()
    out: list[tuple[str, int, int]] = []
    i, n = 0, len(folded)
    while i < n:
        if not _is_token_char(folded[i]):
            i += 1
            continue
        end = i
        while end < n and _is_token_char(folded[end]):
            end += 1
        # one run of token characters: plain segments between CJK stretches, each stretch as its
        # unigrams then bigrams, in the order `tokens` emits them
        j = i
        while j < end:
            k = j
            cjk = _is_cjk(folded[j])
            while k < end and _is_cjk(folded[k]) == cjk:
                k += 1
            if cjk:
                out.extend((folded[x], x, x + 1) for x in range(j, k))
                out.extend((folded[x : x + 2], x, x + 2) for x in range(j, k - 1))
            else:
                out.append((folded[j:k], j, k))
            j = k
        i = end
    return out


def terms(text: str) -> tuple[str, ...]:
    """The distinct terms of a query, in first-seen order."""
    return tuple(dict.fromkeys(tokens(text)))


def lexical_floor(term_count: int) -> int:
    """How many distinct query terms a document must contain to be admitted."""
    if term_count <= 2:
        return 1
    return max(2, math.ceil(0.25 * term_count))


def matched_terms(query_terms: Sequence[str], document_text: str) -> int:
    have = set(tokens(document_text))
    return sum(1 for t in query_terms if t in have)


def admits_lexically(query_terms: Sequence[str], document_text: str, floor: int | None = None) -> bool:
    if not query_terms:
        return False
    need = lexical_floor(len(query_terms)) if floor is None else floor
    return matched_terms(query_terms, document_text) >= need


def pool_size(coarse: int) -> int:
    """How many rows to ask a backend for, given how many candidates the caller keeps."""
    return max(4 * coarse, MIN_POOL)


def unit(vector: Sequence[float]) -> tuple[float, ...] | None:
    """L2-normalised copy; None for an empty, zero or non-finite vector."""
    if not vector:
        return None
    values = [float(v) for v in vector]
    if not all(math.isfinite(v) for v in values):
        return None
    norm = math.sqrt(sum(v * v for v in values))
    if norm == 0.0 or not math.isfinite(norm):
        return None
    return tuple(v / norm for v in values)


@dataclass(frozen=True, slots=True)
class Fused:
    key: bytes  # identity bytes
    score: float
    channels: tuple[str, ...]  # which ranked lists held it: "fts", "vector"


def rrf(ranked: Iterable[tuple[str, Sequence[bytes]]], k: int = RRF_K) -> list[Fused]:
    """Reciprocal rank fusion of ranked identity lists (rank 1 first): score = Σ 1/(k + rank).

    Ties break on the identity bytes, ascending, so the same inputs always give the same order.
    """
    scores: dict[bytes, float] = {}
    seen: dict[bytes, list[str]] = {}
    for channel, keys in ranked:
        for rank, key in enumerate(dict.fromkeys(keys), start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
            seen.setdefault(key, []).append(channel)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [Fused(key, scores[key], tuple(sorted(set(seen[key])))) for key in order]
