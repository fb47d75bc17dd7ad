"""The release window of a stream released as it arrives (`release = "windowed"`).

Owns: how much of a stream's text must stay held back so that every released character
has been inspected together with everything that could still complete a match around it:
the longest text any active rule or detector can match, and the longest wire form of any
configured value, bounded by the policy's documented cap. Rules that can match more than
the cap are named (`capped`): for them a match longer than the cap may have its first part
released before the stream is ended (the decision record says so).
Must not: do I/O or decide anything (the windowed releaser applies it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.inspection import literals

DEFAULT_CAP = 1024


@dataclass(frozen=True, slots=True)
class StreamWindow:
    chars: int  # significant characters held back in each streamed field
    cap: int  # the policy's cap
    needed: int  # what the rules and values alone would need
    capped: tuple[str, ...]  # rule ids whose longest match exceeds the cap
    # Text earlier checks read that the next check's joined read of configured values takes
    # in (twice the longest wire form of a value, within the cap; none without values).
    joined_chars: int = DEFAULT_CAP


def stream_window(
    widths: Sequence[tuple[str, int]], values: Sequence[literals.SecretValue], cap: int = DEFAULT_CAP
) -> StreamWindow:
    """The window for these rule widths and configured values (every wire form of each
    value counts, escaped forms included)."""
    rule_need = max((w for _, w in widths), default=0)
    value_need = max((len(form) for v in values for form in literals.variants(v.value)), default=0)
    needed = max(rule_need, value_need, 1)
    # Twice the longest match: a hex or base64 copy of the longest match fits too.
    chars = min(2 * needed, cap)
    capped = tuple(sorted(rule for rule, w in widths if w > chars))
    if value_need > chars:
        capped = (*capped, "secret_value")
    return StreamWindow(chars=chars, cap=cap, needed=needed, capped=capped, joined_chars=min(2 * value_need, cap))
