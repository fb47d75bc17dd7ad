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
first) and the snippet window; and what admission and BM25 need of analyzer v1's tokens
(which query terms a text holds, how often, and how many tokens it has), counted with string
operations that run in C rather than by listing the tokens a Python step per character.
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
_SENTENCE_MARK = re.compile("[" + re.escape("".join(sorted(_SENTENCE_END))) + "]")
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
    for mark in _SENTENCE_MARK.finditer(text, block.start, block.end - 1):
        i = mark.end()  # each position in the block whose character before ends a sentence
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


# A character's part in analyzer v1: " " not a token character, "w" a plain token character, "c" a
# CJK one (search._is_token_char, search._is_cjk).
_PLAIN, _CJK_CHAR, _NOT_TOKEN = "w", "c", " "
_KINDS_REMEMBERED = 1 << 16  # characters each translation table below keeps (a few MB at most)


def _kind(ch: str) -> str:
    if not search._is_token_char(ch):
        return _NOT_TOKEN
    return _CJK_CHAR if search._is_cjk(ch) else _PLAIN


class _Kinds(dict[int, str]):
    """A `str.translate` table from a code point to its kind, filled as characters are met: a
    character already met is translated in C; a new one asks `_kind` (and is remembered while
    the table is not full — past that it is asked again each time, with the same answer)."""

    def __missing__(self, code: int) -> str:
        kind = _kind(chr(code))
        if len(self) < _KINDS_REMEMBERED:
            self[code] = kind
        return kind


class _PlainOnly(dict[int, str]):
    """A `str.translate` table that makes every character but a plain token character a space."""

    def __missing__(self, code: int) -> str:
        plain = chr(code)
        kept = plain if _kind(plain) == _PLAIN else " "
        if len(self) < _KINDS_REMEMBERED:
            self[code] = kept
        return kept


_KINDS = _Kinds()
_PLAIN_ONLY = _PlainOnly()


def _term_kind(term: str) -> str | None:
    """What kind of token `term` could be: "c" a CJK unigram, "cc" a CJK bigram, "w" a plain
    run; None: no token is ever `term`."""
    kinds = term.translate(_KINDS)
    if kinds in ("c", "cc"):
        return kinds
    return _PLAIN if kinds and kinds == _PLAIN * len(kinds) else None


def matched_terms(terms: Sequence[str], text: str) -> int:
    """`search.matched_terms`: how many of `terms` (each as often as listed) `text` holds as a
    token — found without listing the tokens: a CJK unigram or bigram is one wherever its
    characters occur (CJK characters are tokens wherever they are, and two adjacent ones are in
    one run), a plain term where it is a whole run of plain token characters, and nothing else
    can be a token."""
    if text.isascii():
        have = set(search.tokens(text))
        return sum(1 for t in terms if t in have)
    folded = unicodedata.normalize("NFC", text).casefold()
    words: set[str] | None = None
    count = 0
    for term in terms:
        kind = _term_kind(term)
        if kind == _PLAIN:
            if words is None:
                words = set(folded.translate(_PLAIN_ONLY).split())
            count += term in words
        elif kind is not None:
            count += term in folded
    return count


def admits_lexically(terms: Sequence[str], text: str, need: int) -> bool:
    """`search.admits_lexically` with its floor given."""
    return bool(terms) and matched_terms(terms, text) >= need


def _chunk_terms(wanted: Sequence[tuple[str, str | None]], text: str) -> tuple[int, Counter[str]]:
    """For `search.tokens(text)`: how many tokens it lists, and how often it lists each wanted
    term `(term, _term_kind(term))` it holds, in the order of their first occurrence — counted
    without listing the tokens. In `NFC(text).casefold()` a plain run is one token and a CJK run
    of n characters n unigrams then n - 1 bigrams (the runs in order); a CJK unigram occurs
    wherever its character does, a CJK bigram wherever its two characters are adjacent
    (overlapping when they are the same), a plain term wherever it is a whole plain run."""
    folded = unicodedata.normalize("NFC", text).casefold()
    kinds = folded.translate(_KINDS)
    plain_runs = kinds.count(" w") + kinds.count("cw") + kinds.startswith(_PLAIN)
    cjk_runs = kinds.count(" c") + kinds.count("wc") + kinds.startswith(_CJK_CHAR)
    length = plain_runs + 2 * kinds.count(_CJK_CHAR) - cjk_runs
    plain: str | None = None
    words: Counter[str] | None = None
    found: list[tuple[tuple[int, int, int], str, int]] = []  # (where the token stream first lists it, term, count)
    for term, kind in wanted:
        if kind == _PLAIN:
            if plain is None:
                plain = folded.translate(_PLAIN_ONLY)
                words = Counter(plain.split())
            assert words is not None
            n = words[term]
            if n:
                at = re.search(r"(?<![^ ])" + re.escape(term) + r"(?![^ ])", plain)
                assert at is not None
                found.append(((at.start(), 0, at.start()), term, n))
        elif kind is not None:
            if kind == "cc" and term[0] == term[1]:  # overlapping: a run of k of its character holds k - 1
                n = sum(len(run) - 1 for run in re.findall(re.escape(term[0]) + "{2,}", folded))
            else:
                n = folded.count(term)
            if n:
                x = folded.find(term)
                run = max(kinds.rfind(_NOT_TOKEN, 0, x), kinds.rfind(_PLAIN, 0, x)) + 1
                found.append(((run, len(kind) - 1, x), term, n))
    found.sort()
    return length, Counter({term: n for _, term, n in found})


def topic_text(content: Mapping[str, Any]) -> str:
    """What the `topic_fts` channel reads of a topic: its title and summary."""
    return f"{content.get('title', '')}\n{content.get('summary', '')}"


def detail_text(content: Mapping[str, Any]) -> str:
    return str(content.get("detail", ""))


@dataclass(frozen=True, slots=True)
class DetailMatch:
    """How a topic's detail meets a query, whatever the floor: how many of the query's distinct
    terms its best chunk holds, and that chunk (0 and None when no chunk holds any)."""

    held: int
    chunk: str | None

    def admits(self, need: int) -> bool:
        """Whether the detail channel admits the topic at lexical floor `need`."""
        return need >= 1 and self.held >= need


_NO_MATCH = DetailMatch(0, None)


def detail_match(terms: Sequence[str], detail: str) -> DetailMatch:
    """The detail cut into chunks and each chunk tokenised once: the chunk holding the most
    distinct query terms, then the best BM25 among the topic's chunks (1.4.1 ranks with the
    whole index's statistics, which a topic cannot see), then the first."""
    if not terms:
        return _NO_MATCH
    wanted = [(t, _term_kind(t)) for t in dict.fromkeys(terms)]
    parts = chunks(detail)
    lengths: list[int] = []
    counted: list[Counter[str]] = []  # each chunk's wanted terms, in the order BM25 below sums them
    for part in parts:
        length, held = _chunk_terms(wanted, part)
        lengths.append(length)
        counted.append(held)
    cover = [len(c) for c in counted]
    top = max(cover, default=0)
    if top < 1:
        return _NO_MATCH
    tied = [i for i, c in enumerate(cover) if c == top]
    if len(tied) == 1:
        return DetailMatch(top, parts[tied[0]])
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
    return DetailMatch(top, parts[best])


def best_chunk(terms: Sequence[str], detail: str, need: int) -> str | None:
    """The chunk the detail channel matches the query with, or None when no chunk holds `need`
    of the query's distinct terms (`detail_match`)."""
    if need < 1:
        return None
    match = detail_match(terms, detail)
    return match.chunk if match.admits(need) else None


def topic_channels(
    terms: Sequence[str], content: Mapping[str, Any], need: int, *, first: bool = False
) -> tuple[str, ...]:
    """Which of 1.4.1's lexical channels admit this topic: its title and summary, its detail
    (`first`: only whether any does — the detail is not chunked when the title and summary do)."""
    out: list[str] = []
    if admits_lexically(terms, topic_text(content), need):
        out.append(TOPIC_CHANNEL)
        if first:
            return tuple(out)
    if best_chunk(terms, detail_text(content), need) is not None:
        out.append(DETAIL_CHANNEL)
    return tuple(out)


def detail_snippet(terms: Sequence[str], detail: str, need: int) -> str | None:
    """The snippet of a topic found through its detail; None when the detail channel does not admit it."""
    return match_snippet(terms, detail_match(terms, detail) if need >= 1 else _NO_MATCH, need)


def match_snippet(terms: Sequence[str], match: DetailMatch, need: int) -> str | None:
    """The snippet of a topic whose detail meets the query as `match`; None when the detail
    channel does not admit it at floor `need`."""
    return snippet(terms, match.chunk) if match.admits(need) and match.chunk is not None else None


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
