"""What a finished provider call leaves behind, read from its trail: usage records and
their metrics, and the facts of its access line.

Owns: one usage record per upstream attempt (failed and withheld ones too) — normalised by
the carrier, filtered by the profile's `usage_fields`, estimated only where the profile
asks, all under the runtime the call was pinned to — the session's pace event, and the access-line fields of a
provider call.
Must not: change or delay anything the client receives; it never raises into a request.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway import admission, usage
from gateway.obs import logging as log
from gateway.proxy import pacing
from gateway.proxy.exchange import Admitted, Decoded, Exchange, Planned, Refused, Released, Trail
from gateway.state import METRICS, USAGE_LEDGER
from gateway.vocab import Outcome


def usage_records(ex: Exchange, trail: Trail) -> list[usage.UsageRecord]:
    """One record per attempt; the final attempt carries the response's usage and the
    call's outcome."""
    attempts = trail.attempts
    decoded = trail.last(Decoded)
    final = trail.final
    records: list[usage.UsageRecord] = []
    for index, attempt in enumerate(attempts):
        last = index == len(attempts) - 1
        loaded = ex.runtime.profiles.get(attempt.profile_id)
        profile = loaded.profile if loaded is not None else None
        reported = decoded.usage if last and decoded is not None else None
        if reported and profile is not None:
            reported = usage.believed(reported, frozenset(profile.usage_fields))
        counts = ex.carrier.usage_counts(reported)
        estimator_label = None
        if last and profile is not None and profile.estimator.fill_missing:
            admitted = trail.last(Admitted)
            counts, estimator_label = usage.with_estimates(
                counts,
                input_estimate=admitted.input_estimate if admitted is not None else None,
                output_estimate=decoded.output_estimate if decoded is not None else None,
                estimator=admission.ESTIMATORS[profile.estimator.name].label,
            )
        outcome = final.outcome.value if last and final is not None else attempt.outcome.value
        planned = next((p for p in reversed(list(trail.of(Planned))) if p.profile_id == attempt.profile_id), None)
        records.append(
            usage.UsageRecord(
                request_id=ex.request_id,
                attempt=index,
                profile=attempt.profile_id,
                carrier=ex.carrier.name,
                outcome=outcome,
                status=attempt.status,
                counts=counts,
                estimator=estimator_label,
                account=profile.account if profile is not None else None,
                region=profile.region if profile is not None else None,
                cache_plan=planned.cache.evidence if planned is not None else (),
                cache_prices=profile.cache_prices.name
                if profile is not None and profile.cache.mode != "none"
                else None,
            )
        )
    return records


async def record_usage(app: web.Application, ex: Exchange, trail: Trail) -> None:
    """Step 11: records into the usage ledger and metrics, and the final attempt's event into
    its session's cache pace. Never raises into the request."""
    try:
        metrics = app[METRICS]
        metrics.stage_seconds.labels("checks").observe(sum(c.seconds for c in trail.checks))
        ledger = app[USAGE_LEDGER]
        records = usage_records(ex, trail)
        for record in records:
            await ledger.add(record)
            for kind, count in record.counts.items():
                if count.value is not None:
                    metrics.usage_tokens.labels(kind, record.profile, count.provenance).inc(count.value)
                else:
                    metrics.usage_unknown.labels(kind, record.profile).inc()
        if records:
            await pacing.record(app, ex, trail, records[-1])
    except Exception as exc:  # accounting never fails a request
        log.error("usage_record_failed", request_id=ex.request_id, error_class=type(exc).__name__)


def access_fields(ex: Exchange, trail: Trail) -> dict[str, Any]:
    """The access-line facts of a provider call. The model name is logged only once a
    send check has allowed it (it is client text)."""
    final = trail.final
    released = trail.last(Released)
    attempts = trail.attempts
    outcome: str | None = None
    if final is not None:
        in_stream = isinstance(final, Refused) and final.in_stream
        outcome = Outcome.REFUSED_IN_STREAM.value if in_stream else final.outcome.value
    return {
        "profile": trail.profile_id,
        "model": ex.parsed.model if trail.send_allowed else None,
        "stream": ex.parsed.stream,
        "outcome": outcome,
        "reason_codes": final.reason_codes if isinstance(final, Refused) else None,
        "upstream_status": attempts[-1].status if attempts else None,
        "attempts": len(attempts),
        "bytes_out": released.body_bytes if released is not None else 0,
    }
