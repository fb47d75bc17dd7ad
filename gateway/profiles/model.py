"""UpstreamProfile: the trusted, signed description of where a request may go (SPEC §4).

Owns: the closed schema (pydantic, frozen, extra fields rejected) and the validation that
needs no I/O: https unless `loopback_http` with a loopback IP literal, carriers matching the
provider, sane limits.
Must not: read files or environment variables (credentials are references here and are
resolved by `config.load`).
"""

from __future__ import annotations

import ipaddress
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.carriers import CARRIERS
from gateway.hop import NEVER_PASSED

Provider = Literal["openai", "anthropic", "openai-compatible"]


def _carriers_of(provider: str) -> frozenset[str]:
    """The carrier short names a provider speaks (an openai-compatible server speaks
    OpenAI's schemas), from the carrier registry."""
    wire = "openai" if provider == "openai-compatible" else provider
    return frozenset(c.short_name for c in CARRIERS.values() if c.provider == wire)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CachePrices(_Strict):
    """The cache price multipliers a profile bills under, relative to the base input rate,
    named and versioned like estimators (every usage record says which it was planned by)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,47}@[1-9][0-9]{0,5}$")  # e.g. "anthropic-2025@1"
    read: float = Field(gt=0, lt=1)  # a token read from cache (Anthropic 0.1; OpenAI the model's ratio)
    write_5m: float = Field(ge=1, le=10)  # a token written for 5 min (OpenAI: in-memory retention)
    write_1h: float = Field(ge=1, le=10)  # a token written for 1 h (OpenAI: extended retention)

    @model_validator(mode="after")
    def _longer_costs_more(self) -> CachePrices:
        if self.write_1h < self.write_5m:
            raise ValueError("write_1h must not be cheaper than write_5m")
        return self


# Public list prices per provider (WIRE-FORMATS §2.6, §3.7), used when a profile states none.
# OpenAI's read ratio differs per model (0.5 gpt-4o class, 0.25 gpt-4.1, 0.1 GPT-5.x): the
# default is the least favourable, so a profile that bills better says so.
DEFAULT_PRICES: dict[str, CachePrices] = {
    "anthropic": CachePrices(name="anthropic-2025@1", read=0.1, write_5m=1.25, write_1h=2.0),
    "openai": CachePrices(name="openai-2025@1", read=0.5, write_5m=1.0, write_1h=1.0),
}


class CacheSettings(_Strict):
    mode: Literal["anthropic-cache-control", "openai-prompt-cache-key", "none"] = "none"
    max_breakpoints: int = Field(4, ge=0, le=4)  # Anthropic's limit, client markers included
    min_prefix_tokens: int = Field(1024, ge=0)  # the model's minimum cacheable prefix
    ttl: Literal["5m", "1h"] = "5m"  # conversation breakpoints
    stable_ttl: Literal["5m", "1h"] | None = None  # tools/system/prepared context (default: ttl)
    retention: Literal["in_memory", "24h"] | None = None  # OpenAI prompt_cache_retention
    sharing_boundary: Literal["principal", "scope", "profile"] = "principal"
    prices: CachePrices | None = None  # None: the provider's DEFAULT_PRICES
    pace: bool = True  # choose each write's TTL (or none) from the session's observed pace
    extended_retention: bool = False  # OpenAI: the model accepts prompt_cache_retention "24h"

    @model_validator(mode="after")
    def _retention_is_openai(self) -> CacheSettings:
        if self.extended_retention and self.mode != "openai-prompt-cache-key":
            raise ValueError("extended_retention is an OpenAI prompt_cache_key setting")
        return self


class EstimatorSettings(_Strict):
    name: Literal["runes/4", "character:weighted"] = "runes/4"
    safety_margin: float = Field(1.2, ge=1.0, le=4.0)  # admission: estimate x margin
    fill_missing: bool = False  # estimate usage the provider did not report (else unknown)


class Timeouts(_Strict):
    connect_s: float = Field(10.0, gt=0, le=120)
    read_s: float = Field(300.0, gt=0, le=3600)  # longest silence between bytes
    total_s: float = Field(600.0, gt=0, le=7200)  # whole attempt incl. buffering


class RetryPolicy(_Strict):
    attempts: int = Field(2, ge=0, le=10)  # retries after the first try
    statuses: tuple[int, ...] = (429, 500, 502, 503, 504, 529)
    on_connection_error: bool = True
    backoff_initial_ms: int = Field(250, ge=0, le=60_000)
    backoff_max_ms: int = Field(8_000, ge=0, le=120_000)
    max_retry_after_s: float = Field(30.0, ge=0, le=600)  # longer waits are not retried
    # Resend a request whose connection broke (or timed out) after it was written and before
    # response headers came back: the provider may have received it and be generating (and
    # billing) an answer already. Off (the default), such a call fails closed: 502
    # `upstream_unavailable` / `upstream_reset` (503 `upstream_timeout`), no retry, no
    # fallback, and the SDK is told not to resend either. A connection that could not be
    # opened is `on_connection_error`.
    resend_after_reset: bool = False


class Signature(_Strict):
    key_id: str
    alg: Literal["ed25519"]
    value: str


class UpstreamProfile(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    version: int = Field(ge=1)
    provider: Provider
    carriers: tuple[str, ...]
    base_url: str
    loopback_http: bool = False
    models: tuple[str, ...] = Field(min_length=1)
    credential: str = Field(pattern=r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+|none)$")
    account: str | None = None
    region: str | None = None
    cache: CacheSettings = CacheSettings()
    usage_fields: tuple[str, ...] = ()
    context_window: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    estimator: EstimatorSettings = EstimatorSettings()
    timeouts: Timeouts = Timeouts()
    retry: RetryPolicy = RetryPolicy()
    fallbacks: tuple[str, ...] = ()
    passthrough_headers: tuple[str, ...] = ()
    retention: str | None = None
    # How a strict stream is released: "buffered" (whole, after the check) or "windowed"
    # (as it arrives, holding back the policy's window; SPEC §5, README "Windowed streams").
    release: Literal["buffered", "windowed"] = "buffered"
    not_before: datetime | None = None
    expires: datetime | None = None
    signature: Signature | None = None

    @field_validator("passthrough_headers")
    @classmethod
    def _lower_headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(h.lower() for h in value)
        refused = NEVER_PASSED.intersection(out)
        if refused:  # names from our own list, never other text of the document
            names = ", ".join(sorted(refused))
            raise ValueError(f"passthrough_headers may not include credential, framing or hop-by-hop headers ({names})")
        return out

    @model_validator(mode="after")
    def _check(self) -> UpstreamProfile:
        url = urlsplit(self.base_url)
        if url.query or url.fragment or url.username or url.password:
            raise ValueError("base_url must not carry a query, fragment or userinfo")
        if not url.hostname:
            raise ValueError("base_url has no host")
        if url.scheme == "http":
            if not self.loopback_http or not _is_loopback_literal(url.hostname):
                raise ValueError("http base_url needs loopback_http: true and a loopback IP literal")
        elif url.scheme != "https":
            raise ValueError("base_url must be https")
        allowed = _carriers_of(self.provider)
        if not self.carriers or not set(self.carriers) <= allowed:
            raise ValueError(f"carriers for provider {self.provider} must be among {sorted(allowed)}")
        if self.id in self.fallbacks:
            raise ValueError("a profile cannot be its own fallback")
        for stamp in (self.not_before, self.expires):
            if stamp is not None and stamp.tzinfo is None:
                raise ValueError("not_before/expires must carry a timezone")
        if self.not_before and self.expires and self.expires <= self.not_before:  # both aware: comparable
            raise ValueError("expires must be after not_before")
        return self

    @property
    def cache_prices(self) -> CachePrices:
        """The cache prices this profile is planned by: its own, else its provider's."""
        wire = "openai" if self.provider == "openai-compatible" else self.provider
        return self.cache.prices or DEFAULT_PRICES[wire]

    def serves(self, model: str) -> bool:
        return any(fnmatchcase(model, pattern) for pattern in self.models)

    def carries(self, short_name: str) -> bool:
        return short_name in self.carriers

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, port) of the approved destination."""
        url = urlsplit(self.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return url.scheme, (url.hostname or "").lower(), port


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
