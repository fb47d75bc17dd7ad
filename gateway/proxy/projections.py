"""What a finished provider call leaves behind, read from its trail: usage records and
their metrics, and the facts of its access line.

Owns: one usage record per upstream attempt (failed and withheld ones too) — normalised by
the carrier, filtered by the profile's `usage_fields`, estimated only where the profile
asks, all under the runtime the call was pinned to — the session's pace event, the attribution record of a call that
reached a provider (its blocks' ids, digests and estimates, the invocation and session
digests, the provider's usage of it) when collection is on, and the access-line fields of a
provider call.
Must not: change or delay anything the client receives; it never raises into a request.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from blake3 import blake3
from xxhash import xxh3_128_digest

from gateway import admission, usage
from gateway.attribution import blocks, registry
from gateway.attribution.ledger import USAGE_KINDS, Record
from gateway.attribution.registry import Registry
from gateway.carriers.base import Carrier
from gateway.config.model import AttributionConfig
from gateway.config.runtime import Runtime
from gateway.ledgers.attribution import AttributionLedger
from gateway.obs import logging as log
from gateway.proxy import pacing
from gateway.proxy.exchange import Admitted, Buffered, Decoded, Exchange, Planned, Refused, Released, Trail, Windowed
from gateway.proxy.models import MODEL_ID
from gateway.state import ATTRIBUTION, METRICS, TIMELINE, USAGE_LEDGER
from gateway.vocab import Outcome

# Carriers whose requests are prompts (embeddings inputs are not split into blocks).
ATTRIBUTED_CARRIERS = frozenset({"openai.chat", "openai.responses", "anthropic.messages"})


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


async def record_usage(app: web.Application, ex: Exchange, trail: Trail) -> list[usage.UsageRecord]:
    """Step 11: records into the usage ledger and metrics (returned, for attribution), and the
    final attempt's event into its session's cache pace. Never raises into the request."""
    records: list[usage.UsageRecord] = []
    try:
        app[METRICS].stages["checks"].observe(sum(c.seconds for c in trail.checks))
        records = usage_records(ex, trail)
        for record in records:
            await count_usage(app, record)
        if records:
            await pacing.record(app, ex, trail, records[-1])
    except Exception as exc:  # accounting never fails a request
        log.error("usage_record_failed", request_id=ex.request_id, error_class=type(exc).__name__)
    return records


async def count_usage(app: web.Application, record: usage.UsageRecord) -> None:
    """One usage record into the ledger, the metrics and the UI's timeline (the proxy's
    records and those the check API is given alike)."""
    await app[USAGE_LEDGER].add(record)
    metrics = app[METRICS]
    timeline = app.get(TIMELINE)
    now = time.time()
    for kind, count in record.counts.items():
        if count.value is not None:
            metrics.usage_tokens.labels(kind, record.profile, count.provenance).inc(count.value)
            if timeline is not None:
                timeline.note_usage(now, kind, count.provenance, record.profile, count.value)
        else:
            metrics.usage_unknown.labels(kind, record.profile).inc()


_REGISTRIES: dict[int, tuple[AttributionConfig, Registry]] = {}


def registry_for(config: AttributionConfig) -> Registry:
    """The block registry a configuration defines (built-ins plus its own entries), kept
    per configuration object: a runtime's configuration is frozen, and looking it up by
    identity spares hashing the whole model on every collected call."""
    held = _REGISTRIES.get(id(config))
    if held is not None and held[0] is config:
        return held[1]
    built = registry.build(b.model_dump() for b in config.blocks)
    if len(_REGISTRIES) >= 8:
        _REGISTRIES.pop(next(iter(_REGISTRIES)))
    _REGISTRIES[id(config)] = (config, built)
    return built


def labels_to_split(request: web.Request) -> dict[str, str] | None:
    """The host's block labels when attribution is collecting (an offloaded body is split
    by the worker that parses it); None when it is not."""
    ledger = request.app.get(ATTRIBUTION)
    if ledger is None or not ledger.collecting:
        return None
    labels, invalid = blocks.parse_labels(request.headers.get(blocks.LABEL_HEADER))
    if invalid:
        _labels_ignored(request.app)
    return labels


def _labels_ignored(app: web.Application) -> None:
    """A label header that is unreadable, too large or holds entries that are not pointers
    to ids: its labels are ignored (never refused) and the metrics say so, so that the host
    can find out."""
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.attribution_records.labels("labels_ignored").inc()


def attribute(
    runtime: Runtime, carrier: Carrier, doc: Mapping[str, Any], labels: Mapping[str, str]
) -> blocks.Attributed:
    """The attribution split of a parsed request (on the loop, on a thread, or in the check
    worker that parsed an offloaded body: the document is never parsed again for it)."""
    split = blocks.split(
        carrier.prompt_layout(doc), registry_for(runtime.config.attribution), block_digest(runtime.log_key), labels
    )
    if not blocks.continues_server_state(doc):
        return blocks.Attributed(split, True)
    # A continuation names its parent the way the parent's record names itself (the
    # ledger counts it complete only when that parent is its session's last call).
    parent, conversation = blocks.continued_state(
        doc, functools.partial(invocation_digest, runtime), functools.partial(_conversation_digest, runtime)
    )
    return blocks.Attributed(split, False, parent, conversation)


def invocation_digest(runtime: Runtime, response_id: str) -> str:
    """An invocation's identity as records keep it: the keyed digest of the provider's
    response id (a continuation's `previous_response_id` names its parent the same way)."""
    return runtime.log_digest("invocation\x00" + response_id)


def _conversation_digest(runtime: Runtime, conversation_id: str) -> str:
    return runtime.log_digest("conversation\x00" + conversation_id)


def attribution_record(
    ex: Exchange, trail: Trail, records: list[usage.UsageRecord], ts: float | None = None
) -> tuple[str, Record] | None:
    """The content-free attribution record of a call that reached a provider, with the
    keyed digest of its scope; None for a call that never did (not an input boundary).
    `ts`: when the call ended (now when not given)."""
    if trail.last(Buffered) is None or ex.carrier.name not in ATTRIBUTED_CARRIERS:
        return None
    runtime = ex.runtime
    made = ex.attributed
    if made is None:
        doc = ex.parsed.doc if not ex.offloaded else json.loads(ex.raw)
        labels, _ = blocks.parse_labels(ex.client_headers.get(blocks.LABEL_HEADER))
        made = attribute(runtime, ex.carrier, doc, labels)
    decoded = trail.last(Decoded)
    response_id = decoded.response_id if decoded is not None else None
    final = records[-1].counts if records else {}
    counts = {kind: final[kind] for kind in USAGE_KINDS if kind in final}
    record = Record(
        ts=time.time() if ts is None else ts,
        blocks=made.split.blocks,
        invocation=invocation_digest(runtime, response_id) if response_id else None,
        session=_kept_digest(runtime.log_key, _session_name(ex)) if ex.session else None,
        full_context=made.full_context,
        parent=made.parent,
        conversation=made.conversation,
        usage={kind: (c.value, c.provenance) for kind, c in counts.items()},
        truncated=made.split.truncated,
        profile=trail.profile_id or "",
    )
    return scope_digest(runtime, ex.identity.scope), record


def _session_name(ex: Exchange) -> str:
    """What a session's digest names: the caller's session id within its scope, principal
    and delegated subject (two agents that both call their session "main" never share
    carried blocks), each part length-prefixed so no two names run together."""
    identity = ex.identity
    parts = (identity.scope, identity.principal.id, identity.on_behalf_of or "", ex.session or "")
    return "session\x00" + "".join(f"{len(part)}:{part}" for part in parts)


# Names the construction (earlier: "b3p:" keyed BLAKE3 of the padded text, "b3:" unpadded, "h:" HMAC-SHA256).
BLOCK_DIGEST = "x3b:"
_TRAILER = struct.Struct("<IQ")


def block_message(data: bytes, name: bytes, seed: int) -> bytes:
    """What a block identity's keyed hash takes: the seeded XXH3-128 fingerprint of the
    text's UTF-8 `data` (lone surrogates as "surrogatepass" writes them), then the name, its
    length (u32) and the text's length in bytes (u64), little-endian. The fingerprint is a
    fixed 16 bytes and the trailer gives both lengths, so no two (text, name) pairs run
    together."""
    return xxh3_128_digest(data, seed) + name + _TRAILER.pack(len(name), len(data))


@functools.lru_cache(maxsize=4)
def block_digest(key: bytes) -> Callable[[str, bytes], str]:
    """A block's identity: BLAKE3 in its keyed mode (a PRF, like the HMAC of
    `obs.logging.digest`) of `block_message`, under a key derived from the log key for this
    one purpose, of the block's id and its text's UTF-8 (`blocks.split` encodes each text
    once). A block is hashed on every collected call, up to the whole body: the text
    passes once through XXH3-128 (tens of GB/s; a keyed BLAKE3 of the text itself ran at 3 to
    6 GB/s and was half of a 200 KB call's collection), seeded with 64 bits derived from the
    same key, and only that fingerprint goes through the PRF. What a record keeps stays a
    keyed digest nobody can test guesses against without the key; XXH3 is not collision
    resistant, so a party that learned the seed could make two texts share an identity, which
    would only make attribution count one block where there were two."""
    derived = hmac.digest(key, b"wiregate attribution block identity v3", "sha256")
    seed = int.from_bytes(hmac.digest(key, b"wiregate attribution block fingerprint seed v3", "sha256")[:8], "little")

    def digest(block_id: str, data: bytes) -> str:
        return BLOCK_DIGEST + blake3(block_message(data, block_id.encode(), seed), key=derived).digest(8).hex()

    return digest


def scope_digest(runtime: Runtime, scope: str) -> str:
    return _kept_digest(runtime.log_key, "scope\x00" + scope)


KEPT_DIGEST_CHARS = 256  # longer values are digested each time, never remembered


def _kept_digest(key: bytes, value: str) -> str:
    """`obs.logging.digest` of a value many calls repeat (a scope, a session), remembered
    for short values (at most 4,096 of them: about 1 MiB at worst)."""
    return _remembered(key, value) if len(value) <= KEPT_DIGEST_CHARS else log.digest(value, key)


@functools.lru_cache(maxsize=4096)
def _remembered(key: bytes, value: str) -> str:
    return log.digest(value, key)


def record_attribution(app: web.Application, ex: Exchange, trail: Trail, records: list[usage.UsageRecord]) -> None:
    """Step 11, when collection is on: queue the call's attribution record once the response
    is on its way. The handler returns its response unsent and aiohttp writes it without
    yielding to the loop, so a callback scheduled now runs after those bytes reach the
    socket: the record (or its deferral to the ledger's batched write) is then off the
    caller's latency, and nothing can read it sooner anyway (the ledger writes in batches)."""
    ledger = app.get(ATTRIBUTION)
    if ledger is not None and ledger.collecting:
        asyncio.get_running_loop().call_soon(_record_attribution, app, ledger, ex, trail, records)


def _record_attribution(
    app: web.Application, ledger: AttributionLedger, ex: Exchange, trail: Trail, records: list[usage.UsageRecord]
) -> None:
    """The record itself. A body large enough to be checked in a worker is split on a
    thread, off the event loop. Any other is made with the ledger's next batched write
    (`AttributionLedger.defer`), one after another: made right after its own call, a record
    runs with the caches full of that call's other work, about three times as slow at 1 KB
    (1.5 at 200 KB) as the same code run back to back. Past the ledger's budget of bodies
    held it is made now. Whatever fails here is logged and dropped: attribution never
    affects a request."""
    try:
        if ex.attributed is None and (ex.offloaded or len(ex.raw) >= ex.runtime.config.limits.offload_bytes):
            task = asyncio.create_task(_record_off_loop(app, ledger, ex, trail, records), name="attribution-record")
            ledger.hold(task)
            return
        if ledger.defer(functools.partial(_made_record, app, ex, trail, records, time.time()), len(ex.raw)):
            return
        made = _made_record(app, ex, trail, records)
        if made is not None:
            ledger.add(*made)
    except Exception as exc:
        _failed(app, ex, exc)


def _made_record(
    app: web.Application, ex: Exchange, trail: Trail, records: list[usage.UsageRecord], ts: float | None = None
) -> tuple[str, Record] | None:
    """A record made and counted — on the loop, now or by the ledger's batched write, or on a
    thread for a large body — with the CPU time of the thread that made it (None when the call
    was not an input boundary, or when making it failed: logged and counted, never raised)."""
    started = time.thread_time()
    if ex.attributed is None and blocks.parse_labels(ex.client_headers.get(blocks.LABEL_HEADER))[1]:
        _labels_ignored(app)  # an offloaded body's were read, and counted, before the worker split it
    try:
        made = attribution_record(ex, trail, records, ts)
    except Exception as exc:
        _failed(app, ex, exc)
        return None
    if made is not None:
        metrics = app[METRICS]
        metrics.attribution_records.labels("queued").inc()
        metrics.attribution_seconds.labels("record").inc(time.thread_time() - started)
    return made


def _failed(app: web.Application, ex: Exchange, exc: Exception) -> None:
    log.error("attribution_record_failed", request_id=ex.request_id, error_class=type(exc).__name__)
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.attribution_records.labels("failed").inc()


async def _record_off_loop(
    app: web.Application, ledger: AttributionLedger, ex: Exchange, trail: Trail, records: list[usage.UsageRecord]
) -> None:
    try:
        made = await asyncio.to_thread(_made_record, app, ex, trail, records)
        if made is not None:
            ledger.add(*made)
    except Exception as exc:
        _failed(app, ex, exc)


def logged_model(ex: Exchange, trail: Trail, vouched: Callable[[str, str], bool] | None = None) -> str | None:
    """The model name as the access line carries it. It is client text (a profile's pattern
    such as `claude-*` admits any text after its prefix, and an upstream may answer any
    name): written out only when a send check inspected and allowed it, it has a model id's
    shape, the upstream answered the call with a success, and the name is one the gateway
    can vouch for — `vouched(profile id, name)`: the signed profile names it exactly, or its
    upstream listed it (`ModelCatalogue.vouches`); a keyed digest otherwise (the same name,
    the same digest), and nothing when no send check inspected it."""
    model = ex.parsed.model
    if not model or not trail.send_allowed:
        return None
    attempts = trail.attempts
    status = attempts[-1].status if attempts else None
    served = status is not None and 200 <= status < 300 and MODEL_ID.fullmatch(model) is not None
    if served and vouched is not None and trail.profile_id and vouched(trail.profile_id, model):
        return model
    return ex.runtime.log_digest(model)


def access_fields(ex: Exchange, trail: Trail, vouched: Callable[[str, str], bool] | None = None) -> dict[str, Any]:
    """The access-line facts of a provider call (the model name as `logged_model` says)."""
    final = trail.final
    released = trail.last(Released)
    attempts = trail.attempts
    outcome: str | None = None
    if final is not None:
        in_stream = isinstance(final, Refused) and final.in_stream
        outcome = Outcome.REFUSED_IN_STREAM.value if in_stream else final.outcome.value
    return {
        "profile": trail.profile_id,
        "model": logged_model(ex, trail, vouched),
        "stream": ex.parsed.stream,
        "outcome": outcome,
        "reason_codes": final.reason_codes if isinstance(final, Refused) else None,
        "upstream_status": attempts[-1].status if attempts else None,
        "attempts": len(attempts),
        "bytes_out": released.body_bytes if released is not None else 0,
        **_windowed_fields(trail.last(Windowed)),
    }


def _windowed_fields(windowed: Windowed | None) -> dict[str, Any]:
    if windowed is None:
        return {}
    return {
        "release": "windowed",
        "window": windowed.window,
        "window_cap": windowed.cap,
        "window_capped_rules": windowed.capped_rules,
        "window_checks": windowed.checks,
        "released_early": windowed.early_bytes,
    }
