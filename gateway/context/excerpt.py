"""Topic-memory detail: PowerContext 1.4.1's chunks, channel admission and snippet.

1.4.1 indexes a topic twice — its title and summary (`topic_fts`) and its detail cut into
chunks (`detail_fts`) — and a topic hit found through the detail carries a `snippet`: an
excerpt of its best chunk, whitespace-compacted and at most 480 characters, windowed around
where the query's terms cluster, with `…` at each end that was cut.

Owns: the `markdown-v1` chunking (blocks at blank lines, headings and list items; blocks over
1,800 characters split at sentence ends, then into overlapping 1,800-character windows;
blocks joined up to 1,800 and closed at 1,200; a short tail joined to its predecessor; fixed
windows when there would be more than 200 chunks), which of the two channels admits a topic,
the best chunk (most distinct query terms, then BM25 over the topic's own chunks, then the
first) and the snippet window.
Must not: do I/O, search a store, or render; terms are analyzer v1 (context/search.py).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.context import search

SNIPPET_CHARS = 480  # the longest snippet, ellipses included
CHUNK_TARGET_CHARS = 1_200  # a chunk being assembled closes once it is this long
CHUNK_MAX_CHARS = 1_800  # no chunk is longer
CHUNK_MIN_TAIL_CHARS = 300  # a last chunk shorter than this joins the one before, if they fit
CHUNK_OVERLAP_CHARS = 160  # fixed windows (an oversized sentence, too many chunks) overlap this much
CHUNK_MAX_COUNT = 200  # more chunks than this: the whole detail is cut into fixed windows instead
ELLIPSIS = "…"

TOPIC_CHANNEL, DETAIL_CHANNEL = "topic_fts", "detail_fts"

# Where a Markdown block starts: a run of blank lines (at its first newline), a heading line, or a
# list item line. Each pattern finds positions on its own; they never fall inside one another's match.
_BLANK_LINES = re.compile(r"\n[ \t]*\n+")
_HEADING = re.compile(r"^(?=#{1,6}[ \t]+)", re.MULTILINE)
_LIST_ITEM = re.compile(r"^(?=[ \t]*(?:[-*+] |\d+[.)] ))", re.MULTILINE)
_SENTENCE_END = frozenset(".!?。！？")  # noqa: RUF001 - the full-width marks end sentences too
_BM25_K1, _BM25_B = 1.2, 0.75  # FTS5's bm25() defaults


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    end: int
    forced: bool = False  # a fixed window: never joined with a neighbour

    @property
    def size(self) -> int:
        return self.end - self.start


def _trim(text: str, start: int, end: int) -> _Span | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return _Span(start, end) if start < end else None


def _windows(start: int, end: int) -> Iterator[tuple[int, int]]:
    """Overlapping fixed windows covering [start, end)."""
    while True:
        stop = min(start + CHUNK_MAX_CHARS, end)
        yield start, stop
        if stop == end:
            return
        start = stop - CHUNK_OVERLAP_CHARS


def _pieces(text: str, cuts: set[int]) -> Iterator[_Span]:
    """The trimmed, non-empty spans between consecutive cut positions."""
    ordered = sorted(cuts)
    for left, right in zip(ordered, ordered[1:], strict=False):
        span = _trim(text, left, right)
        if span is not None:
            yield span


def _sentences(text: str, block: _Span) -> Iterator[_Span]:
    """An oversized block at its sentence ends (after the punctuation's run of spaces and tabs,
    or right after it before a newline), and a sentence still too long as fixed windows."""
    cuts = {block.start, block.end}
    for i in range(block.start + 1, block.end):
        if text[i - 1] not in _SENTENCE_END:
            continue
        if text[i] == "\n":
            cuts.add(i)
        elif text[i] in " \t":
            j = i
            while j < block.end and text[j] in " \t":
                j += 1
            cuts.add(j)
    for sentence in _pieces(text, cuts):
        if sentence.size <= CHUNK_MAX_CHARS:
            yield sentence
        else:
            yield from (_Span(a, b, forced=True) for a, b in _windows(sentence.start, sentence.end))


def chunks(detail: str) -> list[str]:
    """The detail's chunks, in order (1.4.1 `markdown-v1`)."""
    cuts = {0, len(detail)}
    for pattern in (_BLANK_LINES, _HEADING, _LIST_ITEM):
        cuts.update(m.start() for m in pattern.finditer(detail))
    atoms: list[_Span] = []
    for block in _pieces(detail, cuts):
        if block.size <= CHUNK_MAX_CHARS:
            atoms.append(block)
        else:
            atoms.extend(_sentences(detail, block))
    spans: list[_Span] = []
    open_: _Span | None = None
    for atom in atoms:
        if atom.forced:
            spans.extend(s for s in (open_, atom) if s is not None)
            open_ = None
        elif open_ is None:
            open_ = atom
        elif atom.end - open_.start <= CHUNK_MAX_CHARS:
            open_ = _Span(open_.start, atom.end)
            if open_.size >= CHUNK_TARGET_CHARS:
                spans.append(open_)
                open_ = None
        else:
            spans.append(open_)
            open_ = atom
    if open_ is not None:
        spans.append(open_)
    if len(spans) >= 2:
        last, before = spans[-1], spans[-2]
        if not last.forced and last.size < CHUNK_MIN_TAIL_CHARS and last.end - before.start <= CHUNK_MAX_CHARS:
            spans[-2:] = [_Span(before.start, last.end)]
    if len(spans) > CHUNK_MAX_COUNT:
        spans = [s for s in (_trim(detail, a, b) for a, b in _windows(0, len(detail))) if s is not None]
    return [detail[s.start : s.end] for s in spans]


def best_chunk(terms: Sequence[str], detail: str, need: int) -> str | None:
    """The chunk the detail channel matches the query with, or None when no chunk holds `need`
    of the query's distinct terms: the one holding the most, then the best BM25 among the
    topic's chunks (1.4.1 ranks with the whole index's statistics, which a topic cannot see),
    then the first."""
    wanted = set(terms)
    if not wanted or need < 1:
        return None
    parts = chunks(detail)
    lengths: list[int] = []
    counted: list[Counter[str]] = []
    for part in parts:
        found = search.tokens(part)
        lengths.append(len(found))
        counted.append(Counter(t for t in found if t in wanted))
    cover = [len(c) for c in counted]
    top = max(cover, default=0)
    if top < need:
        return None
    tied = [i for i, c in enumerate(cover) if c == top]
    if len(tied) == 1:
        return parts[tied[0]]
    average = sum(lengths[i] for i in tied) / len(tied) or 1.0
    holding = Counter(t for i in tied for t in counted[i])

    def score(i: int, length: int) -> float:
        norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * length / average)
        total = 0.0
        for term, tf in counted[i].items():
            idf = max(1e-6, math.log((len(tied) - holding[term] + 0.5) / (holding[term] + 0.5)))
            total += idf * tf * (_BM25_K1 + 1) / (tf + norm)
        return total

    best = max(tied, key=lambda i: (score(i, lengths[i]), -i))
    return parts[best]


def topic_channels(
    terms: Sequence[str], content: Mapping[str, Any], need: int, *, first: bool = False
) -> tuple[str, ...]:
    """Which of 1.4.1's lexical channels admit this topic: its title and summary, its detail
    (`first`: only whether any does — the detail is not chunked when the title and summary do)."""
    out: list[str] = []
    if search.admits_lexically(terms, f"{content.get('title', '')}\n{content.get('summary', '')}", need):
        out.append(TOPIC_CHANNEL)
        if first:
            return tuple(out)
    if best_chunk(terms, str(content.get("detail", "")), need) is not None:
        out.append(DETAIL_CHANNEL)
    return tuple(out)


def detail_snippet(terms: Sequence[str], detail: str, need: int) -> str | None:
    """The snippet of a topic found through its detail; None when the detail channel does not admit it."""
    chunk = best_chunk(terms, detail, need)
    return None if chunk is None else snippet(terms, chunk)


def snippet(terms: Sequence[str], text: str) -> str:
    """`text` with its whitespace runs made single spaces; past 480 characters, the window of
    480 (ellipses included) centred where the query's terms cluster, clamped to the text."""
    compact = " ".join(text.split())
    size = len(compact)
    if size <= SNIPPET_CHARS:
        return compact
    focus = _focus(terms, compact)

    def window(ellipses: int) -> tuple[int, int]:
        room = SNIPPET_CHARS - ellipses
        start = max(0, min(focus - room // 2, size - room))
        return start, start + room

    # Guess which ends will be cut from where the focus is; if the window says otherwise, redo it
    # with the ellipses it really needs.
    guess = int(focus > SNIPPET_CHARS // 2) + int(size - focus > SNIPPET_CHARS // 2)
    start, end = window(guess)
    actual = int(start > 0) + int(end < size)
    if actual != guess:
        start, end = window(actual)
    return (ELLIPSIS if start else "") + compact[start:end] + (ELLIPSIS if end < size else "")


def _focus(terms: Sequence[str], value: str) -> int:
    """Where in `value` the window centres: the middle of the shortest stretch (at most 478
    characters) holding the most distinct query terms, the earliest of equals; the middle of
    `value` when it holds none."""
    wanted = set(terms)
    found = sorted((start, end - start, term) for term, start, end in search.token_spans(value) if term in wanted)
    if not found:
        return len(value) // 2
    reach = SNIPPET_CHARS - 2
    held: Counter[str] = Counter()
    first = 0
    best: tuple[int, int, int] = (0, 0, 0)
    middle = found[0][0]
    for position, length, term in found:
        stop = position + min(length, reach)  # a term longer than the window still counts where it starts
        held[term] += 1
        while stop - found[first][0] > reach:
            gone = found[first][2]
            held[gone] -= 1
            if not held[gone]:
                del held[gone]
            first += 1
        begin = found[first][0]
        key = (len(held), begin - stop, -begin)
        if key > best:
            best, middle = key, (begin + stop) // 2
    lo, hi = _source_spans(value)[middle]
    return (lo + hi) // 2


def _source_spans(value: str) -> list[tuple[int, int]]:
    """For each code point of `NFC(value).casefold()`, the span of `value` it came from."""
    folded = unicodedata.normalize("NFC", value).casefold()
    spans: list[tuple[int, int]] = []
    parts: list[str] = []
    start = 0
    for end in range(1, len(value) + 1):
        if end < len(value) and unicodedata.combining(value[end]):
            continue  # a base character and its combining marks normalise together
        part = unicodedata.normalize("NFC", value[start:end]).casefold()
        parts.append(part)
        spans.extend([(start, end)] * len(part))
        start = end
    if "".join(parts) == folded:
        return spans
    # Composition across characters with no combining class (Hangul jamo, say): map each position
    # through the normalised lengths of the prefixes of `value`.
    prefix = [len(unicodedata.normalize("NFC", value[:end]).casefold()) for end in range(len(value) + 1)]
    last_at_most = [0] * (len(folded) + 2)  # the longest prefix whose normalised length is ≤ p
    for end, length in enumerate(prefix):
        if length <= len(folded) + 1:
            last_at_most[length] = max(last_at_most[length], end)
    for p in range(1, len(last_at_most)):
        last_at_most[p] = max(last_at_most[p], last_at_most[p - 1])
    return [(last_at_most[p], max(last_at_most[p] + 1, last_at_most[p + 1])) for p in range(len(folded))]
