"""The models a caller may use (`GET /v1/models`), even where profiles name them by pattern.

Owns: asking each profile's upstream for its model list (the profile's own URL and
credential, never a redirect, a bounded body and time), reading it (ids only in a
conservative alphabet, at most `MAX_MODELS` per profile), inspecting the upstream's answer
as any response is before release (a finding drops the list: it is not released), keeping
only ids the profile's patterns serve (plus the names it lists exactly), a short bounded
cache per profile version and configuration generation, and the union over the profiles a
principal may use right now. An upstream that cannot be asked
(unreachable, an error status, no credential, an unreadable or refused answer) contributes
the profile's exact (non-pattern) model names instead; the listing itself never fails.
Must not: send any content upstream, or let one failing profile fail the listing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase

import aiohttp
from aiohttp import web

from gateway.carriers import common, jsonraw
from gateway.carriers.base import CarrierLimits
from gateway.checks import inspect
from gateway.checks.destination import Target, destination_ok
from gateway.config.runtime import LoadedProfile, Principal, Runtime
from gateway.obs import logging as log
from gateway.proxy.upstream import UPSTREAM, Upstream, upstream_headers

# Where each provider lists its models, relative to the profile's base_url.
_PATHS = {"openai": "/models", "openai-compatible": "/models", "anthropic": "/v1/models"}
_QUERY = {"anthropic": {"limit": "1000"}}  # Anthropic pages by 20 unless asked for more
LISTED_S = 60.0  # how long an upstream's list is reused
FALLBACK_S = 10.0  # how long a failed ask is remembered (exact names meanwhile)
ASK_TIMEOUT_S = 10.0  # one ask, connect included
MAX_BODY = 1024 * 1024  # a model list is a few kB; anything larger is not read
MAX_MODELS = 1000  # per profile
MAX_CACHED = 256  # profile versions remembered
# A provider's model id: no spaces, no quotes, no control characters, a bounded length.
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_EPOCH = "1970-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True)
class Model:
    id: str
    created: int = 0  # OpenAI: unix seconds
    created_at: str = _EPOCH  # Anthropic: RFC 3339
    display_name: str | None = None
    owned_by: str = ""


@dataclass(frozen=True, slots=True)
class _Listed:
    models: tuple[Model, ...]
    until: float


def is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def exact_models(loaded: LoadedProfile) -> tuple[Model, ...]:
    p = loaded.profile
    return tuple(Model(m, owned_by=p.provider) for m in p.models if not is_pattern(m))


def read_list(runtime: Runtime, loaded: LoadedProfile, raw: bytes) -> tuple[Model, ...] | None:
    """The models an upstream's answer lists that this profile serves, or None when the
    answer cannot be read or may not be released (inspected as a response is)."""
    limits = CarrierLimits(runtime.config.limits.json_depth, runtime.config.limits.embedded_json_depth)
    folded = common.json_response(raw, limits, error_key="error")
    if not folded.complete or folded.is_error:
        return None
    verdict = inspect.inspect(runtime, inspect.response_subject(folded, raw, {}), loaded.profile.id)
    if not verdict.allowed:
        log.warning("models_withheld", profile=loaded.profile.id, reason_codes=verdict.reason_codes)
        return None
    doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    p = loaded.profile
    out: dict[str, Model] = {}
    for entry in data[: MAX_MODELS * 4]:
        mid = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(mid, str) or not MODEL_ID.fullmatch(mid) or not p.serves(mid) or mid in out:
            continue
        created, created_at = _when(entry.get("created"), entry.get("created_at"))
        name = entry.get("display_name")
        out[mid] = Model(
            mid,
            created=created,
            created_at=created_at,
            display_name=name if isinstance(name, str) and 0 < len(name) <= 128 and name.isprintable() else None,
            owned_by=p.provider,
        )
        if len(out) >= MAX_MODELS:
            break
    return tuple(out.values())


def _when(created: object, stamp: object) -> tuple[int, str]:
    """A model's creation time in both shapes (OpenAI: unix seconds; Anthropic: RFC 3339),
    from whichever the upstream gave; the epoch when it gave neither."""
    if isinstance(stamp, str) and _STAMP.match(stamp):
        try:
            return int(datetime.fromisoformat(stamp).timestamp()), stamp
        except ValueError:
            pass
    if type(created) is int and 0 <= created < 2**37:
        return created, datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return 0, _EPOCH


class ModelCatalogue:
    """Each profile version's models, asked of its upstream at most once per `LISTED_S`
    (concurrent askers share one ask)."""

    def __init__(self) -> None:
        self._listed: OrderedDict[tuple[str, str, int], _Listed] = OrderedDict()
        self._asking: dict[tuple[str, str, int], asyncio.Task[_Listed]] = {}

    async def models(self, upstream: Upstream, runtime: Runtime, loaded: LoadedProfile) -> tuple[Model, ...]:
        # A reload (new policy, new secrets) asks again: a list is only released as checked
        # under the configuration that serves it.
        key = (loaded.profile.id, loaded.digest, runtime.generation)
        listed = self._listed.get(key)
        if listed is not None and listed.until > time.monotonic():
            return listed.models
        task = self._asking.get(key)
        if task is None:
            task = asyncio.create_task(self._ask(upstream, runtime, loaded))
            self._asking[key] = task
            task.add_done_callback(lambda _: self._asking.pop(key, None))
        listed = await asyncio.shield(task)
        self._listed[key] = listed
        self._listed.move_to_end(key)
        while len(self._listed) > MAX_CACHED:
            self._listed.popitem(last=False)
        return listed.models

    def vouches(self, runtime: Runtime, profile_id: str, model: str) -> bool:
        """Did this profile's upstream list `model` in its last answer under this runtime
        (checked as every listing is), or does the signed profile name it exactly? Never asks."""
        loaded = runtime.profiles.get(profile_id)
        if loaded is None:
            return False
        if model in loaded.profile.models and not is_pattern(model):
            return True
        listed = self._listed.get((profile_id, loaded.digest, runtime.generation))
        return listed is not None and any(m.id == model for m in listed.models)

    async def _ask(self, upstream: Upstream, runtime: Runtime, loaded: LoadedProfile) -> _Listed:
        fallback = _Listed(exact_models(loaded), time.monotonic() + FALLBACK_S)
        try:
            return await self._ask_upstream(upstream, runtime, loaded, fallback)
        except Exception as exc:  # one profile never fails the listing; nothing unchecked is listed
            log.error("models_unavailable", profile=loaded.profile.id, error_class=type(exc).__name__)
            return fallback

    async def _ask_upstream(
        self, upstream: Upstream, runtime: Runtime, loaded: LoadedProfile, fallback: _Listed
    ) -> _Listed:
        p = loaded.profile
        if loaded.credential_error is not None or p.credential != "none" and not loaded.credential:
            return fallback
        target = Target.for_profile(loaded, "models", _PATHS[p.provider])
        if not destination_ok(target, loaded, runtime):
            return fallback
        timeout = aiohttp.ClientTimeout(total=min(ASK_TIMEOUT_S, p.timeouts.total_s), connect=p.timeouts.connect_s)
        got = await upstream.get(
            target.url,
            upstream_headers(p, loaded.credential, {}),
            params=_QUERY.get(p.provider, {}),
            client_timeout=timeout,
            limit=MAX_BODY,
        )
        if got is None or not 200 <= got[0] < 300:
            log.warning("models_unavailable", profile=p.id, upstream_status=got[0] if got else None)
            return fallback
        models = read_list(runtime, loaded, got[1])  # at most MAX_BODY: checked on the loop
        if models is None:
            return fallback
        listed = {m.id for m in models}  # and what the profile names exactly, listed or not
        return _Listed((*models, *(m for m in fallback.models if m.id not in listed)), time.monotonic() + LISTED_S)


async def for_principal(app: web.Application, runtime: Runtime, principal: Principal) -> list[Model]:
    """The union, in the principal's profile order, of the models each profile it may use
    right now serves and its `models` patterns allow."""
    now = datetime.now(UTC)
    usable = [
        runtime.profiles[pid]
        for pid in principal.profiles
        if pid in runtime.profiles
        and runtime.profiles[pid].valid_at(now)
        and runtime.policy.retention_ok(runtime.profiles[pid].profile)
    ]
    catalogue, upstream = app[MODEL_CATALOGUE], app[UPSTREAM]
    lists = await asyncio.gather(*(catalogue.models(upstream, runtime, lp) for lp in usable))
    seen: dict[str, Model] = {}
    for models in lists:
        for model in models:
            if model.id not in seen and any(fnmatchcase(model.id, pat) for pat in principal.models):
                seen[model.id] = model
    return list(seen.values())


MODEL_CATALOGUE = web.AppKey("wiregate_model_catalogue", ModelCatalogue)
