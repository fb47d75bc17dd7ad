"""The configuration files as validated models (pydantic, frozen, extra fields rejected).

Owns: the schema of `wiregate.toml` (server, limits, trust, files), `principals.toml` and
`policy.toml`, each setting's default and a one-line reason for it.
Must not: read files, resolve secrets or compile anything (`load.py` and `runtime.py` do).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.attribution.registry import RegistryError, build


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpsListener(_Strict):
    host: str = "127.0.0.1"  # loopback by default: exposing the gateway is a deliberate act
    port: int = Field(8443, ge=0, le=65535)
    cert: str = "tls/server.pem"
    key: str = "tls/server.key"


class UdsListener(_Strict):
    path: str = "run/wiregate.sock"
    mode: str = Field("0660", pattern=r"^0?[0-7]{3}$")  # owner + group; a socket is not a credential


class ServerSettings(_Strict):
    https: HttpsListener | None = HttpsListener()
    uds: UdsListener | None = UdsListener()
    # How long in-flight requests may finish on shutdown.
    shutdown_grace_s: float = Field(10.0, ge=0, le=300)
    # On SIGTERM /readyz answers 503 "draining" for this long before the listeners close, so a
    # load balancer stops sending new calls first; in-flight calls then get shutdown_grace_s.
    drain_s: float = Field(0.0, ge=0, le=60)
    # uvloop measurably lowers added latency; "asyncio" is the standard-library loop.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Worker processes that parse and check large bodies off the event loop (0: decide
    # every body on the loop; large ones then stall other connections while checked).
    check_workers: int = Field(2, ge=0, le=64)


class Limits(_Strict):
    """Every limit is an explicit refusal when exceeded, never a truncation."""

    # Largest request body accepted (matches Anthropic's 32 MB Messages limit).
    request_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    # Largest body after gzip decoding: bounds decompression bombs.
    decompressed_request_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    # Largest buffered provider response (a full 2048-input embeddings batch fits).
    response_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # Longest time a response may take to buffer completely (long reasoning streams).
    buffer_seconds: float = Field(600.0, gt=0, le=7200)
    # Responses held in memory at once; past it new calls get 503 instead of queuing.
    concurrent_buffered_responses: int = Field(256, ge=1, le=100_000)
    # JSON nesting accepted from clients and providers (deep tool schemas fit).
    json_depth: int = Field(64, ge=4, le=512)
    # Times JSON held inside a string (tool arguments) is decoded again for inspection.
    embedded_json_depth: int = Field(3, ge=0, le=8)
    # Confirmed matches per scan before inspection gives up and withholds (fail closed).
    max_matches: int = Field(100_000, ge=100)
    # From the first byte of a request head to its last (also the TLS handshake): a
    # client that trickles a head is cut off (slowloris), 408 when it can still be told.
    request_head_s: float = Field(10.0, gt=0, le=300)
    # Longest silence while a body arrives, and the longest time for the whole body → 408.
    body_idle_s: float = Field(30.0, gt=0, le=600)
    body_total_s: float = Field(120.0, gt=0, le=3600)
    # An idle keep-alive connection is closed after this long.
    idle_connection_s: float = Field(75.0, gt=0, le=3600)
    # A client that reads nothing of what is written to it for this long (the connection's
    # send buffer full the whole time) is cut off: it holds no call slot, no buffered
    # response and no connection past it. A slow reader that keeps reading is never cut.
    write_stall_s: float = Field(30.0, gt=0, le=600)
    # Open connections, in all and from one client (a TCP peer address, or a Unix-socket
    # peer uid); past either a connection is answered 503 and closed.
    max_connections: int = Field(2048, ge=1, le=1_000_000)
    max_connections_per_client: int = Field(256, ge=1, le=1_000_000)
    # Provider calls one principal may have in flight; past it 429 `capacity_exceeded`.
    per_principal_concurrent: int = Field(128, ge=1, le=100_000)
    # Bodies of at least this size are parsed and checked by `server.check_workers`.
    offload_bytes: int = Field(1024 * 1024, ge=1024)


class TrustSettings(_Strict):
    # Public keys (files written by `wiregate keys new-signing-key`) allowed to sign profiles.
    profile_keys: tuple[str, ...] = ()


class StreamingSettings(_Strict):
    # Send SSE comment heartbeats while a strict stream buffers, after this many seconds
    # (0 = never). Once a heartbeat is out, a block becomes the protocol's error event.
    heartbeat_after_s: float = Field(0.0, ge=0, le=600)
    heartbeat_every_s: float = Field(15.0, gt=0, le=600)
    # Heartbeats stand in for a slow upstream that is still sending. Once the upstream has
    # sent no new bytes for this long they stop, so a stalled upstream lets the client's
    # own read timeout fire (rather than keep-alives feeding it until the profile's read_s).
    heartbeat_stall_s: float = Field(30.0, gt=0, le=600)


class BindingSettings(_Strict):
    # How long an allowed send may still be sent (third-party gateways send right after).
    send_valid_s: float = Field(120.0, gt=0, le=3600)
    # How long a release may refer to its send: covers buffering a long response.
    correlate_s: float = Field(900.0, gt=0, le=86400)
    # How long a release decision stays valid for the caller to act on.
    release_valid_s: float = Field(120.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _send_within_correlation(self) -> BindingSettings:
        # A send binding carries issued_at = now, expires_at = now + send_valid_s and
        # correlate_until = now + correlate_s, and its opener refuses one that is not
        # issued_at <= expires_at <= correlate_until (checks/claims.py) as never ours. The
        # first half holds by send_valid_s > 0; the second needs this, or every send binding
        # would be withheld `binding_invalid` after the upstream call was made. (A release
        # binding and a reuse binding have one lifetime each: nothing else to order.)
        if self.send_valid_s > self.correlate_s:
            raise ValueError("bindings.send_valid_s must not be greater than bindings.correlate_s")
        return self


class LoggingSettings(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    # The W3C trace id a client sends is client text: logged as a keyed digest unless the
    # operator trusts its clients and wants raw ids to join logs with a tracing backend.
    trace_ids: Literal["digest", "raw"] = "digest"


class StoreSettings(_Strict):
    """The one database: the context store, and the ledgers replicas must share."""

    backend: Literal["sqlite", "postgres"] = "sqlite"
    # SQLite: one file (WAL), relative to the configuration directory.
    path: str = "data/wiregate.db"
    # PostgreSQL: a connection string as a reference, never inline (it may hold a password).
    dsn: str | None = Field(None, pattern=r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
    pg_schema: str = Field("wiregate", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    pool_max: int = Field(8, ge=1, le=256)
    # SQLite only: when a commit is on disk. "full" (default) syncs the log at every commit, so an
    # acknowledged write survives power loss; "normal" syncs it at checkpoints, so an acknowledged
    # write survives the process being killed but the last commits may be lost if the machine loses
    # power (the file is never corrupted either way). PostgreSQL's durability is its own setting.
    sqlite_sync: Literal["full", "normal"] = "full"

    @model_validator(mode="after")
    def _dsn_for_postgres(self) -> StoreSettings:
        if self.backend == "postgres" and self.dsn is None:
            raise ValueError("store.backend = postgres needs store.dsn (env:NAME or file:PATH)")
        if self.backend == "postgres" and self.sqlite_sync != "full":
            raise ValueError("store.sqlite_sync applies to the SQLite store only")
        return self


class ContextConfig(_Strict):
    """The context layer (SPEC §10): memory routes, prepare, reuse bindings."""

    enabled: bool = True
    # How long a reuse binding from prepare stays valid for replay.
    reuse_ttl_s: float = Field(900.0, gt=0, le=86400)
    # Vectors for vector/hybrid search come from this embeddings profile, through the
    # gateway's own checks; none: fts only (auto falls back to fts).
    embeddings_profile: str | None = None
    embeddings_model: str = "text-embedding-3-small"
    # Vector size to ask for (OpenAI's `dimensions`); none: the model's own.
    embeddings_dimensions: int | None = Field(None, ge=1, le=8192)
    embed_timeout_s: float = Field(10.0, gt=0, le=120)
    # The deterministic reranker of prepare's candidate pools (context/rerank.py), recorded in
    # the receipt: "off" (default) or "coverage".
    rerank: Literal["off", "coverage"] = "off"
    rerank_candidate_limit: int = Field(30, ge=1, le=100)
    rerank_min_share: float = Field(0.5, gt=0, le=1)
    # Largest memory request body (PowerContext 1.4.1: 16 MiB).
    request_bytes: int = Field(16 * 1024 * 1024, ge=1024)


class MockProviderSettings(_Strict):
    """The bundled mock provider, served by the gateway process itself (development only:
    `wiregate init` writes it enabled so `make run` answers the mock-* profiles at once)."""

    enabled: bool = False
    # Loopback TCP port; the generated mock-* profiles point at it. It never listens on
    # anything but 127.0.0.1.
    port: int = Field(9901, ge=1, le=65535)
    # The key upstream callers must present (the mock profiles' credential), as a
    # reference; none: any caller is answered.
    api_key: str | None = Field(None, pattern=r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")


class AttributionBlock(_Strict):
    """An operator's own block id for the attribution registry (`[[attribution.blocks]]`)."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_.]{2,127}$")
    display_name: str = Field(min_length=1, max_length=80)
    type: Literal["instruction", "turn_context", "notice", "reference"]
    origin: Literal["host_policy", "host_generated", "workspace_configuration", "user_task_payload", "unknown"]
    control: Literal["direct", "assembly", "none", "unknown"]
    lifetime: Literal["boundary_only", "session_persistent", "until_replaced", "unknown"]
    action: str = Field(min_length=1, max_length=300)
    validation: str = Field(min_length=1, max_length=300)
    target: int | None = Field(None, ge=0)  # per-injection target estimate (tokens)
    singleton: bool = False
    compactable: bool = False
    compacts: bool = False


class AttributionConfig(_Strict):
    """Token attribution (SPEC §11). Collection itself is switched at runtime (off at first start)."""

    # Raw records are kept this long; seven days is the ceiling.
    retention_days: float = Field(7.0, gt=0, le=7)
    # Records one report reads (newest first); more makes the report `limited`.
    max_records: int = Field(100_000, ge=10, le=1_000_000)
    blocks: tuple[AttributionBlock, ...] = ()

    @model_validator(mode="after")
    def _registrable(self) -> AttributionConfig:
        try:
            build(b.model_dump() for b in self.blocks)
        except RegistryError as exc:
            raise ValueError(str(exc)) from None
        return self


class GatewayConfig(_Strict):
    deployment_id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    server: ServerSettings = ServerSettings()
    limits: Limits = Limits()
    trust: TrustSettings = TrustSettings()
    streaming: StreamingSettings = StreamingSettings()
    bindings: BindingSettings = BindingSettings()
    logging: LoggingSettings = LoggingSettings()
    store: StoreSettings = StoreSettings()
    context: ContextConfig = ContextConfig()
    mock_provider: MockProviderSettings = MockProviderSettings()
    attribution: AttributionConfig = AttributionConfig()
    profiles_dir: str = "profiles"
    principals_file: str = "principals.toml"
    policy_file: str = "policy.toml"
    keyring_file: str = "keys/bindings-keyring.json"


Action = Literal[
    "proxy", "context.read", "context.prepare", "context.write", "context.check", "observe", "admin", "delegate"
]


class PrincipalEntry(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9._@-]{1,128}$")
    type: Literal["user", "service"] = "service"
    # sha256 hex of each accepted gateway key; the keys themselves are never stored.
    key_sha256: tuple[str, ...] = Field(min_length=1)
    actions: tuple[Action, ...] = ("proxy",)
    profiles: tuple[str, ...] = ()  # in priority order: the first that serves the model wins
    models: tuple[str, ...] = ("*",)
    scopes: tuple[str, ...] = ("default",)
    default_scope: str = "default"
    may_act_for: tuple[str, ...] = ()  # subjects this principal may delegate for
    # Per-scope actions (scope id or glob → actions), first match wins; scopes not named
    # here use `actions`. Only narrows or widens what `scopes` already lets it reach.
    scope_actions: dict[str, tuple[Action, ...]] = {}

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for digest in value:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("key_sha256 entries must be 64 lowercase hex characters")
        return value


class PrincipalsFile(_Strict):
    principal: tuple[PrincipalEntry, ...] = ()


PhaseMode = Literal["enforce", "observe", "off"]


class Modes(_Strict):
    before_send: PhaseMode = "enforce"
    before_release: PhaseMode = "enforce"


class ModeOverride(_Strict):
    before_send: PhaseMode | None = None
    before_release: PhaseMode | None = None


class SecretValues(_Strict):
    # Where configured literals come from: "file:PATH" (one per line, or a JSON list if
    # PATH ends in .json) or "env:NAME" (newline-separated). Never inline.
    sources: tuple[str, ...] = ()
    min_length: int = Field(8, ge=4, le=4096)  # shorter values would block ordinary text

    @field_validator("sources")
    @classmethod
    def _refs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ref in value:
            if not (ref.startswith("file:") or ref.startswith("env:")):
                raise ValueError("secret value sources must be file:PATH or env:NAME references")
        return value


class FormatsPolicy(_Strict):
    catalogue: bool = True  # the built-in credential-format catalogue
    disable: tuple[str, ...] = ()  # rule ids turned off
    advisory: tuple[str, ...] = ()  # rule ids that may only record, never block alone
    custom_file: str | None = None  # extra rules, same JSON schema as the catalogue


DetectorMode = Literal["off", "advisory", "required"]


class DetectorsPolicy(_Strict):
    # advisory: findings are recorded, never block; required: a finding blocks (pii:<kind>)
    # and a detector that fails withholds (detector_unavailable).
    email: DetectorMode = "off"
    phone: DetectorMode = "off"
    card: DetectorMode = "off"
    iban: DetectorMode = "off"
    us_ssn: DetectorMode = "off"


class PolicyFile(_Strict):
    version: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    # "hyperscan" is the engine of record; "python" is the documented slow engine, allowed
    # only when chosen here (a missing hyperscan never silently downgrades matching).
    engine: Literal["hyperscan", "python"] = "hyperscan"
    modes: Modes = Modes()
    profile_modes: dict[str, ModeOverride] = {}
    route_modes: dict[str, ModeOverride] = {}
    secret_values: SecretValues = SecretValues()
    formats: FormatsPolicy = FormatsPolicy()
    detectors: DetectorsPolicy = DetectorsPolicy()
    # Profiles whose targets may receive content nobody can inspect (images, files, audio,
    # token arrays, encrypted reasoning). Empty: such content is withheld.
    allow_opaque_profiles: tuple[str, ...] = ()
    # Content may only go to profiles whose signed `retention` promise (the provider's
    # data-retention terms, e.g. "zero-data-retention") is one of these. Empty: any.
    retention_required: tuple[str, ...] = ()
    # Text carrying the prepared-context markers: "verify_if_bound" checks every replay a
    # request names and lets unnamed marker text through as ordinary (inspected) content;
    # "require_binding" withholds marker text no verified replay covers.
    prepared_context: Literal["verify_if_bound", "require_binding"] = "verify_if_bound"
    # Profiles with `release = "windowed"` hold back this many characters of each streamed
    # field at most (the longest match of the active rules and values, bounded by this cap;
    # rules that can match more are named in every windowed call's decision record).
    stream_window_cap: int = Field(1024, ge=64, le=65536)
