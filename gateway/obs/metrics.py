"""Every Prometheus metric, defined once, on a registry owned by the app.

Label values are bounded: route, carrier, profile id, phase, decision, reason code, mode,
outcome, cache TTL (5m, 1h) and bet result (won, lost). Never scope ids, principal ids, request ids or content.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

M = TypeVar("M", Counter, Histogram)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


# The stages of the wire path, in order, and `checks` (all checks of one call).
STAGES = (
    "read", "parse", "plan", "check_before_send", "upstream", "buffer", "check_before_release", "release", "checks"
)  # fmt: skip


MAX_KEPT_CHILDREN = 4096  # per metric: past this, children are looked up each time (never an error)


class Labelled(Generic[M]):
    """A labelled metric whose children are remembered: prometheus_client's `labels()`
    checks and converts its values and takes a lock on every call (about 2.5 µs here, eight
    times on a proxied call), a dict lookup does not. The label values are bounded (see the
    module docstring), and so is what this keeps."""

    __slots__ = ("metric", "_children")

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if len(self._children) < MAX_KEPT_CHILDREN:
                self._children[values] = child
        return child


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Labelled(
            Counter(
                "wiregate_requests",
                "Requests by route and outcome",
                ["route", "carrier", "profile", "outcome"],
                registry=r,
            )
        )
        self.request_seconds = Labelled(
            Histogram(
                "wiregate_request_seconds",
                "End-to-end request latency",
                ["route"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.stage_seconds = Histogram(
            "wiregate_stage_seconds",
            "Latency of each stage of the wire path: read, parse, plan, check_before_send, upstream (to the"
            " response headers), buffer, check_before_release, release; checks (all checks of a call)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # The children once (a labels() lookup per stage per call is work on the hot path).
        self.stages = {name: self.stage_seconds.labels(name) for name in STAGES}
        self.decisions = Labelled(
            Counter(
                "wiregate_decisions",
                "Check decisions by phase, decision, reason and mode",
                ["phase", "decision", "reason", "mode"],
                registry=r,
            )
        )
        self.advisory_findings = Labelled(
            Counter(
                "wiregate_advisory_findings",
                "Advisory findings (never block alone) by phase and rule",
                ["phase", "reason"],
                registry=r,
            )
        )
        self.check_seconds = Labelled(
            Histogram(
                "wiregate_check_seconds",
                "Duration of a check",
                ["phase"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.upstream_attempts = Labelled(
            Counter(
                "wiregate_upstream_attempts",
                "Upstream attempts by profile and outcome",
                ["profile", "outcome"],
                registry=r,
            )
        )
        self.buffered_bytes = Gauge(
            "wiregate_buffered_bytes",
            "Response bytes currently held for checking",
            registry=r,
        )
        self.buffered_responses = Gauge(
            "wiregate_buffered_responses",
            "Responses currently being buffered",
            registry=r,
        )
        self.usage_tokens = Labelled(
            Counter(
                "wiregate_usage_tokens",
                "Tokens by kind, profile and provenance",
                ["kind", "profile", "provenance"],
                registry=r,
            )
        )
        self.cache_bets = Labelled(
            Counter(
                "wiregate_cache_bets",
                "Cache writes settled by the session's next request: won (read) or lost (expired unread)",
                ["profile", "ttl", "result"],
                registry=r,
            )
        )
        self.usage_unknown = Labelled(
            Counter(
                "wiregate_usage_unknown",
                "Attempts whose usage figure of a kind is unknown",
                ["kind", "profile"],
                registry=r,
            )
        )
        self.attribution_records = Labelled(
            Counter(
                "wiregate_attribution_records",
                "Attribution records of proxied calls by outcome (queued, failed; labels_ignored: a call's"
                " x-wiregate-blocks header was unreadable and its labels ignored), while collection is on",
                ["outcome"],
                registry=r,
            )
        )
        self.attribution_seconds = Labelled(
            Counter(
                "wiregate_attribution_seconds",
                "CPU time spent collecting attribution while collection is on, by part: each call's record"
                " (its split, block identities and estimates) and the ledger's batched writes",
                ["part"],
                registry=r,
            )
        )
        self.reloads = Labelled(
            Counter(
                "wiregate_config_reloads",
                "Configuration reloads by outcome",
                ["outcome"],
                registry=r,
            )
        )

        self.offloaded = Labelled(
            Counter(
                "wiregate_offloaded",
                "Large-body decisions by stage (parse, send, read) and outcome (done, stale, busy, failed)",
                ["stage", "outcome"],
                registry=r,
            )
        )
        self.offload_in_flight = Gauge(
            "wiregate_offload_in_flight",
            "Decisions running in the check workers",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
