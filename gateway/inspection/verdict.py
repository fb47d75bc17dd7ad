"""Verdicts: the one result type every check returns.

Owns: `Coverage`, `Finding`, `Verdict`, and folding findings into a decision (the
vocabulary itself — `Decision`, `ReasonCode` — is `gateway.vocab`).
Must not: hold content. A Verdict names *where* (JSON pointers) and *why* (reason codes),
never *what* matched; it is safe to log, serialise and return to a client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.units import Path, location, pointer
from gateway.vocab import Decision, ReasonCode


@dataclass(frozen=True, slots=True)
class Coverage:
    profile: str
    complete: bool

    def as_json(self) -> dict[str, object]:
        return {"profile": self.profile, "complete": self.complete}


COVERAGE_PROFILE = "text-and-tools.v1"


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a unit failed, located by its path in the document (never the matched
    text). The path can hold object keys, which are content: `pointer` is for the
    process that holds the content anyway; `location` is what may be logged."""

    reason: str
    path: Path | None = None
    advisory: bool = False

    @property
    def pointer(self) -> str | None:
        return None if self.path is None else pointer(self.path)

    @property
    def location(self) -> str | None:
        return None if self.path is None else location(self.path)


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason_codes: tuple[str, ...]
    coverage: Coverage
    policy_version: str
    findings: tuple[Finding, ...] = field(default=())

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOW

    def locations(self) -> list[str]:
        """Where findings are, safe to log (see `location`)."""
        return sorted({loc for f in self.findings if (loc := f.location) is not None})


def decide(
    findings: list[Finding],
    *,
    withhold_reasons: list[str],
    complete: bool,
    policy_version: str,
) -> Verdict:
    """Fold findings into one Verdict: any blocking finding → block; else any withhold
    reason or incomplete coverage → withhold; else allow. Advisory findings never decide."""
    findings = sorted(findings, key=lambda f: (f.reason, f.pointer or "", f.advisory))
    blocking = [f for f in findings if not f.advisory]
    codes: list[str] = []  # deterministic: finding reasons sorted, then withhold reasons
    for reason in [f.reason for f in blocking] + withhold_reasons:
        if reason not in codes:
            codes.append(reason)
    if blocking:
        decision = Decision.BLOCK
    elif withhold_reasons or not complete:
        decision = Decision.WITHHOLD
    else:
        decision = Decision.ALLOW
    if decision is Decision.WITHHOLD and not codes:
        codes.append(ReasonCode.OPAQUE_CONTENT if not complete else ReasonCode.POLICY_UNAVAILABLE)
    return Verdict(
        decision=decision,
        reason_codes=tuple(codes),
        coverage=Coverage(COVERAGE_PROFILE, complete),
        policy_version=policy_version,
        findings=tuple(findings),
    )


def withhold(reason: str, policy_version: str, *, complete: bool = False) -> Verdict:
    return Verdict(
        decision=Decision.WITHHOLD,
        reason_codes=(reason,),
        coverage=Coverage(COVERAGE_PROFILE, complete),
        policy_version=policy_version,
    )


def with_withholds(verdict: Verdict, reasons: list[str]) -> Verdict:
    """`verdict` plus further withhold reasons (checks made outside the engine)."""
    if not reasons:
        return verdict
    finding_reasons = {f.reason for f in verdict.findings if not f.advisory}
    earlier = [c for c in verdict.reason_codes if c not in finding_reasons]
    return decide(
        list(verdict.findings),
        withhold_reasons=earlier + reasons,
        complete=verdict.coverage.complete,
        policy_version=verdict.policy_version,
    )
