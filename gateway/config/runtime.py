"""The compiled, frozen runtime every request reads, and the one reference that holds it.

Owns: `Runtime` (profiles by id with resolved credentials, principals by key digest, the
compiled policy/engine, limits, key ring) and `RuntimeHolder` (atomic swap on reload; a
failed reload keeps the running runtime).
Must not: read files (load.py does) or hold anything mutable once built.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gateway.carriers.base import CarrierLimits
from gateway.config.model import GatewayConfig, PrincipalEntry
from gateway.context.rerank import RerankSettings
from gateway.inspection.engine import Engine
from gateway.inspection.window import DEFAULT_CAP, StreamWindow
from gateway.keyring import KeyRing
from gateway.profiles.model import UpstreamProfile
from gateway.vocab import Mode, Phase


@dataclass(frozen=True)
class Principal:
    id: str
    type: str
    actions: frozenset[str]
    profiles: tuple[str, ...]
    models: tuple[str, ...]
    scopes: tuple[str, ...]
    default_scope: str
    may_act_for: tuple[str, ...]
    scope_actions: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def from_entry(cls, entry: PrincipalEntry) -> Principal:
        return cls(
            id=entry.id,
            type=entry.type,
            actions=frozenset(entry.actions),
            profiles=entry.profiles,
            models=entry.models,
            scopes=entry.scopes,
            default_scope=entry.default_scope,
            may_act_for=entry.may_act_for,
            scope_actions=tuple((pattern, frozenset(acts)) for pattern, acts in entry.scope_actions.items()),
        )

    def may(self, action: str) -> bool:
        return action in self.actions


@dataclass(frozen=True)
class LoadedProfile:
    profile: UpstreamProfile
    source: str  # file name, for messages
    digest: str  # sha256 of the signed canonical JSON: what bindings name
    credential: str | None = field(repr=False)  # resolved secret; never logged
    credential_error: str | None = None  # why it is unavailable (content-free)

    def valid_at(self, now: datetime) -> bool:
        p = self.profile
        return (p.not_before is None or p.not_before <= now) and (p.expires is None or now < p.expires)


@dataclass(frozen=True)
class Policy:
    version: str
    modes: Mapping[Phase, Mode]
    profile_modes: Mapping[str, Mapping[Phase, Mode]]
    route_modes: Mapping[str, Mapping[Phase, Mode]]
    allow_opaque_profiles: frozenset[str]
    engine: Engine
    secret_value_count: int
    retention_required: frozenset[str] = frozenset()
    content_digest: str = field(default="", repr=False)
    prepared_context: str = "verify_if_bound"  # the file, its rules and literals
    window: StreamWindow = StreamWindow(DEFAULT_CAP, DEFAULT_CAP, DEFAULT_CAP, ())  # windowed release

    def retention_ok(self, profile: UpstreamProfile) -> bool:
        """May content go to this profile under its data-retention promise?"""
        return not self.retention_required or profile.retention in self.retention_required

    def mode(self, phase: Phase, *, profile: str | None, route: str | None) -> Mode:
        """Route override, then profile override, then the policy default."""
        for table, key in ((self.route_modes, route), (self.profile_modes, profile)):
            if key is not None and phase in table.get(key, {}):
                return table[key][phase]
        return self.modes[phase]


@dataclass(frozen=True)
class Runtime:
    config: GatewayConfig
    base_dir: Path
    profiles: Mapping[str, LoadedProfile]
    principals: tuple[tuple[bytes, Principal], ...]  # (sha256 digest, principal)
    policy: Policy
    carrier_limits: CarrierLimits
    keyring: KeyRing
    generation: int = 0
    log_key: bytes = field(default=b"", repr=False)  # keys `obs.logging.digest`
    store_dsn: str | None = field(default=None, repr=False)  # resolved store.dsn (may hold a password)
    warnings: tuple[str, ...] = ()  # loud, content-free findings of the load (file modes)

    @functools.cached_property
    def decision_key(self) -> str:
        """What makes two runtimes the same for a decision: the whole configuration, the
        policy as compiled (its file, rules and literals), every profile as signed, and the
        key ring (its secrets through a digest). Check workers compare it (proxy/offload)."""
        parts = [
            self.config.model_dump_json(),
            self.policy.version,
            self.policy.content_digest,
            *sorted(f"{pid}={lp.digest}" for pid, lp in self.profiles.items()),
            self.keyring.active.id,
            *sorted(f"{k.id}:{k.state}:{hashlib.sha256(k.secret).hexdigest()}" for k in self.keyring.keys.values()),
        ]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    @functools.cached_property
    def rerank(self) -> RerankSettings | None:
        """The prepare reranker `[context] rerank` names (None: off); a reload brings its own."""
        cfg = self.config.context
        if cfg.rerank == "coverage":
            return RerankSettings(cfg.rerank_candidate_limit, cfg.rerank_min_share)
        return None

    def log_digest(self, value: str) -> str:
        from gateway.obs.logging import digest

        return digest(value, self.log_key)

    def authenticate(self, key: str) -> Principal | None:
        """Constant-time over every stored digest: no early exit, no digest-keyed lookup."""
        presented = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for digest, principal in self.principals:
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


class RuntimeHolder:
    """The one reference to the current Runtime. Requests read `current` once and keep it."""

    def __init__(self, runtime: Runtime) -> None:
        self._current = runtime

    @property
    def current(self) -> Runtime:
        return self._current

    def swap(self, runtime: Runtime) -> None:
        self._current = runtime
