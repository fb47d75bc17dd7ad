"""Compile a policy's matching material into an `Engine` (once per configuration load).

Owns: choosing the matcher (Hyperscan, or the documented slow engine only when the policy
says so), expanding literals into their wire forms, and wiring format rules to their
windowed confirmation.
Must not: read files or environment (values arrive as arguments).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.inspection import literals
from gateway.inspection.engine import Engine, FormatInfo
from gateway.inspection.rules import HyperscanMatcher, LiteralForm, Matcher, PythonMatcher


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot run here (e.g. hyperscan failed to import)."""


class FormatSource(Protocol):
    """What `build_engine` needs of a credential-format catalogue."""

    def infos(self) -> Sequence[FormatInfo]: ...

    def patterns(self) -> Sequence[str]: ...

    def confirm(self, index: int, data: bytes, end: int) -> list[tuple[int, int]]: ...

    def full_scan(self, data: bytes) -> list[tuple[int, int, int]]: ...


class _NoFormats:
    def infos(self) -> Sequence[FormatInfo]:
        return ()

    def patterns(self) -> Sequence[str]:
        return ()

    def confirm(self, index: int, data: bytes, end: int) -> list[tuple[int, int]]:
        return []

    def full_scan(self, data: bytes) -> list[tuple[int, int, int]]:
        return []


def build_engine(
    *,
    secret_values: Sequence[str | literals.SecretValue],
    formats: FormatSource | None = None,
    policy_version: str,
    engine: str = "hyperscan",
    max_matches: int = 100_000,
    max_candidates: int | None = None,
) -> Engine:
    source: FormatSource = formats or _NoFormats()
    values = [v if isinstance(v, literals.SecretValue) else literals.SecretValue(v) for v in secret_values]
    forms = [(i, form, v.ignore_case) for i, v in enumerate(values) for form in literals.variants(v.value)]
    infos = list(source.infos())
    matcher: Matcher
    if engine == "hyperscan":
        matcher = _hyperscan(forms, infos, source.patterns(), source.confirm, max_matches, max_candidates)
    elif engine == "python":
        matcher = PythonMatcher(forms, source.full_scan, max_matches=max_matches)
    else:
        raise EngineUnavailable(f"unknown inspection engine {engine!r}")
    return Engine(matcher, infos, policy_version=policy_version)


def _hyperscan(
    forms: list[LiteralForm],
    infos: list[FormatInfo],
    patterns: Sequence[str],
    confirm: Callable[[int, bytes, int], list[tuple[int, int]]],
    max_matches: int,
    max_candidates: int | None,
) -> Matcher:
    try:
        import hyperscan  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the platform
        raise EngineUnavailable(
            'the hyperscan package cannot be imported; install it, or set engine = "python" '
            "in the policy to use the documented slow engine"
        ) from exc

    class _Rule:
        __slots__ = ("id", "pattern", "advisory")

        def __init__(self, info: FormatInfo, pattern: str) -> None:
            self.id, self.pattern, self.advisory = info.id, pattern, info.advisory

    rules = [_Rule(info, pattern) for info, pattern in zip(infos, patterns, strict=True)]
    return HyperscanMatcher(forms, rules, confirm, max_matches=max_matches, max_candidates=max_candidates)
