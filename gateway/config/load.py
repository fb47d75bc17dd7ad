"""The only place configuration files, profile files and secret sources are read.

Owns: reading `wiregate.toml` and the files it names, verifying every profile's signature
*before* parsing its content, resolving credential and secret-value references, and
compiling the result into a `Runtime`. Every failure is a `ConfigError` whose message names
the file and the reason — never a secret value, credential or file content.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tomllib
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.carriers import ROUTES
from gateway.carriers.base import CarrierLimits
from gateway.config.model import GatewayConfig, ModeOverride, PolicyFile, PrincipalsFile
from gateway.config.runtime import LoadedProfile, Policy, Principal, Runtime
from gateway.inspection import literals
from gateway.inspection.build import EngineUnavailable, build_engine
from gateway.inspection.formats import FormatConfigError, FormatSet, build_format_set
from gateway.inspection.window import stream_window
from gateway.keyring import KeyRingError, load_keyring
from gateway.profiles import signing
from gateway.profiles.model import UpstreamProfile
from gateway.vocab import Mode, Phase


class ConfigError(Exception):
    """Configuration that must not be served. The message is safe to log."""


M = TypeVar("M", bound=BaseModel)


def _validation_message(exc: ValidationError) -> str:
    # Never echo input values: they may be credentials or secret material.
    parts = []
    for err in exc.errors(include_url=False, include_context=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _model(cls: type[M], data: Any, where: str) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: invalid: {_validation_message(exc)}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    except ValueError:  # a path holding a NUL
        raise ConfigError(f"{path!r}: cannot be read (not a usable path)") from None
    return _toml_document(data, path)


def _toml_document(data: bytes | str, path: Path) -> dict[str, Any]:
    """TOML text (of the file at `path`) as a document, or a ConfigError saying why not."""
    try:
        return tomllib.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc.args[0][:120] if exc.args else ''})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML (not UTF-8)") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (nested too deeply)") from None


class Private:
    """Files whose content is a secret (key ring, provider credentials, configured secret
    values) and the principals file, collected while loading and checked together: a
    secret file that others may read refuses the load; one the group may read, and a
    principals file anyone else may read, are warnings the server logs loudly.

    Files that decide what the gateway enforces or trusts (the configuration, the policy,
    its custom format rules, the principals, the trusted profile keys, and every secret
    file) must not be writable by others: whoever can write them can empty the secret
    values, add a principal or a signing key, so that refuses the load; writable by the
    group is a warning. Writable by others also means: owned by a user that is neither the
    gateway's effective uid nor root (the owner may rewrite it whatever its mode), or
    replaceable, in a directory (the file's own, and every one above it up to and including
    the configuration directory `base` when the file is inside it) that others may write
    without the sticky bit or that such a user owns. A directory the group may write
    without the sticky bit is a warning. A directory on a read-only mount lets no one
    replace what is in it (a Kubernetes ConfigMap or Secret volume), so it is not judged."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = base
        self.secret_files: dict[Path, str] = {}
        self.guarded_files: dict[Path, str] = {}
        self.warnings: list[str] = []

    def secret(self, path: Path, what: str) -> None:
        self.secret_files.setdefault(path, what)

    def guarded(self, path: Path, what: str) -> None:
        self.guarded_files.setdefault(path, what)

    def check(self, principals: Path) -> tuple[str, ...]:
        self.guarded(principals, "principals")
        writable = {**self.guarded_files, **self.secret_files}
        # (files, bit others may not have: the load is refused, bit the group should not have, what it is, fix)
        rules = (
            (writable, 0o002, 0o020, "writable", "chmod o-w it"),
            (self.secret_files, 0o004, 0o040, "readable", "chmod 600 it"),
        )
        for files, others, group, able, fix in rules:
            for path, what in files.items():
                mode = _mode(path)
                if mode is None:
                    continue
                if mode & others:
                    raise ConfigError(f"{what}: {path} is {able} by others (mode {mode:04o}); {fix}")
                if mode & group:
                    self.warnings.append(f"{what}: {path} is {able} by its group (mode {mode:04o})")
        judged: set[Path] = set()
        for path, what in writable.items():
            self._owner_and_directories(path, what, judged)
        mode = _mode(principals)
        if mode is not None and mode & 0o044:
            self.warnings.append(f"principals: {principals} is readable by group or others (mode {mode:04o})")
        return tuple(self.warnings)

    def _owner_and_directories(self, path: Path, what: str, judged: set[Path]) -> None:
        """Refuse `path` if a user other than this gateway's and root can rewrite or replace it."""
        try:
            owner = path.stat().st_uid
        except OSError:
            return
        if not _trusted_owner(owner):
            raise ConfigError(
                f"{what}: {path} is writable by others (owned by uid {owner}, neither this gateway's "
                f"uid {os.geteuid()} nor root); chown it"
            )
        for directory in _directories(path, self.base):
            if directory in judged:
                continue
            judged.add(directory)
            try:
                st = directory.stat()
                if os.statvfs(directory).f_flag & os.ST_RDONLY:
                    continue  # a read-only mount: no one replaces what is in it
            except OSError:
                continue
            if not _trusted_owner(st.st_uid):
                raise ConfigError(
                    f"{what}: {path} is writable by others: its directory {directory} is owned by uid "
                    f"{st.st_uid}, neither this gateway's uid {os.geteuid()} nor root; chown it"
                )
            mode = st.st_mode & 0o7777
            if mode & stat.S_ISVTX:
                continue  # sticky: only a file's owner (or the directory's) may replace it
            if mode & 0o002:
                raise ConfigError(
                    f"{what}: {path} is writable by others: its directory {directory} is writable by others "
                    f"without the sticky bit (mode {mode:04o}); chmod o-w it"
                )
            if mode & 0o020:
                self.warnings.append(
                    f"{what}: {path} can be replaced by its directory's group: {directory} is writable by its "
                    f"group without the sticky bit (mode {mode:04o})"
                )


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _directories(path: Path, base: Path | None) -> list[Path]:
    """The directories whose writers could replace `path`: its own, and when it is inside
    `base`, every one above it up to and including `base`; for the path as named (a symlink
    there can be replaced) and for the file it resolves to."""
    out: list[Path] = []
    real_base = None if base is None else Path(os.path.realpath(base))
    for file, top in ((Path(os.path.normpath(path)), base), (Path(os.path.realpath(path)), real_base)):
        directory = file.parent
        chain = [directory]
        if top is not None and (directory == top or top in directory.parents):
            while directory != top:
                directory = directory.parent
                chain.append(directory)
        out.extend(d for d in chain if d not in out)
    return out


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return None


def resolve(base: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


def read_config(path: Path) -> GatewayConfig:
    return _model(GatewayConfig, _read_toml(path), str(path))


# --- secrets -------------------------------------------------------------------------


def read_reference(ref: str, base: Path, what: str, private: Private | None = None) -> str:
    """Resolve `env:NAME` or `file:PATH` to its value. Errors name the reference only.
    `private`: the file holds a secret and is registered for the mode check."""
    if ref.startswith("env:"):
        name = ref[4:]
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"{what}: environment variable {name} is not set")
        return value
    if ref.startswith("file:"):
        path = resolve(base, ref[5:])
        if private is not None:
            private.secret(path, what)
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{what}: {path} cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{what}: {path} is not UTF-8") from None
    raise ConfigError(f"{what}: references must be env:NAME or file:PATH")


def _json_secret(item: Any) -> str | literals.SecretValue | None:
    """A JSON source entry: a string, or {"value": str, "ignore_case": bool}."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and set(item) <= {"value", "ignore_case"} and isinstance(item.get("value"), str):
        ignore_case = item.get("ignore_case", False)
        if isinstance(ignore_case, bool):
            return literals.SecretValue(item["value"], ignore_case)
    return None


def _value_lines(ref: str, text: str) -> list[str]:
    """The values of a line source, one per non-empty line, each matched exactly as written:
    a line that begins or ends with whitespace (an editor's trailing space or tab) would name
    a value that never matches the real one, so it is refused, never loaded as a secret
    nothing blocks; a leading byte-order mark is not part of the first value."""
    values = []
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        if line != line.strip():
            raise ConfigError(
                f"policy secret_values: {ref.partition(':')[2]} line {n} begins or ends with whitespace "
                "(values are matched exactly as written; a JSON source holds a value that needs it)"
            )
        if line:
            values.append(line)
    return values


def read_secret_values(
    sources: tuple[str, ...], base: Path, min_length: int, private: Private | None = None
) -> tuple[literals.SecretValue, ...]:
    values: list[str | literals.SecretValue] = []
    for ref in sources:
        text = read_reference(ref, base, "policy secret_values", private)
        if ref.startswith("file:") and ref.endswith(".json"):
            try:
                loaded = json.loads(text)
            except (ValueError, RecursionError):
                raise ConfigError(f"policy secret_values: {ref[5:]} is not a JSON list") from None
            entries = [_json_secret(v) for v in loaded] if isinstance(loaded, list) else [None]
            if any(e is None for e in entries):
                raise ConfigError(
                    f"policy secret_values: {ref[5:]} must be a JSON list of strings or "
                    '{"value": ..., "ignore_case": true|false} objects'
                )
            values.extend(e for e in entries if e is not None)
        else:
            values.extend(_value_lines(ref, text))
    try:
        return literals.validate(values, min_length=min_length)
    except literals.LiteralError as exc:
        raise ConfigError(f"policy secret_values: {exc}") from None


# --- profiles ------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key")
    return obj


def _refuse_constant(_: str) -> Any:
    raise ValueError("non-finite number")


def parse_profile_json(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def load_trusted_keys(paths: tuple[str, ...], base: Path) -> dict[str, signing.TrustedKey]:
    keys: dict[str, signing.TrustedKey] = {}
    for ref in paths:
        path = resolve(base, ref)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            key = signing.trusted_key(str(doc["key_id"]), str(doc["public_key"]))
        except OSError as exc:
            raise ConfigError(f"{path}: trusted key cannot be read ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ConfigError(f"{path}: not a trusted-key file (key_id, public_key)") from None
        keys[key.key_id] = key
    return keys


def load_profile(
    path: Path, trusted: dict[str, signing.TrustedKey], now: datetime, base: Path, private: Private | None = None
) -> LoadedProfile:
    where = f"profile {path.name}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror})") from None
    try:
        doc = parse_profile_json(data)
    except ValueError:
        raise ConfigError(f"{where}: refused: not a valid JSON object (or duplicate keys)") from None
    try:
        signing.verify(doc, trusted)  # before anything in the document is believed
    except signing.SignatureError as exc:
        raise ConfigError(f"{where}: refused: {exc}") from None
    profile = _model(UpstreamProfile, doc, f"{where}: refused")
    if profile.expires is not None and profile.expires <= now:
        raise ConfigError(f"{where}: refused: expired at {profile.expires.isoformat()}")
    if profile.not_before is not None and now < profile.not_before:
        raise ConfigError(f"{where}: refused: not valid before {profile.not_before.isoformat()}")
    digest = "sha256:" + hashlib.sha256(signing.canonical_payload(doc)).hexdigest()
    credential: str | None = None
    error: str | None = None
    if profile.credential != "none":
        try:
            credential = read_reference(profile.credential, base, where, private).strip()
            if not credential:
                error = "credential is empty"
        except ConfigError as exc:
            error = str(exc)
    return LoadedProfile(profile, path.name, digest, credential, error)


def load_profiles(
    directory: Path, trusted: dict[str, signing.TrustedKey], now: datetime, base: Path, private: Private | None = None
) -> dict[str, LoadedProfile]:
    if not directory.is_dir():
        raise ConfigError(f"{directory}: profiles directory not found")
    if not trusted:
        raise ConfigError("trust.profile_keys is empty: no profile can be trusted")
    loaded: dict[str, LoadedProfile] = {}
    for path in sorted(directory.glob("*.json")):
        item = load_profile(path, trusted, now, base, private)
        if item.profile.id in loaded:
            raise ConfigError(f"profile {path.name}: refused: duplicate id {item.profile.id}")
        loaded[item.profile.id] = item
    for item in loaded.values():
        for fallback in item.profile.fallbacks:
            if fallback not in loaded:
                raise ConfigError(f"profile {item.source}: fallback {fallback} is not a loaded profile")
    return loaded


# --- principals and policy -------------------------------------------------------------


def load_principals(path: Path, profiles: dict[str, LoadedProfile]) -> tuple[tuple[bytes, Principal], ...]:
    return _principals(_read_toml(path), path, profiles)


def check_principals_text(text: str, path: Path, profile_ids: Collection[str] | None) -> None:
    """Would `text` load as the principals file at `path`? (ConfigError if not.) With
    `profile_ids` None, the profiles principals name are not checked."""
    _principals(_toml_document(text, path), path, profile_ids)


def _principals(
    data: dict[str, Any], path: Path, profiles: Collection[str] | None
) -> tuple[tuple[bytes, Principal], ...]:
    file = _model(PrincipalsFile, data, str(path))
    out: list[tuple[bytes, Principal]] = []
    seen_ids: set[str] = set()
    seen_keys: set[str] = set()
    for entry in file.principal:
        if entry.id in seen_ids:
            raise ConfigError(f"{path}: duplicate principal id {entry.id}")
        seen_ids.add(entry.id)
        for pid in entry.profiles:
            if profiles is not None and pid not in profiles:
                raise ConfigError(f"{path}: principal {entry.id} names unknown profile {pid}")
        if entry.default_scope not in entry.scopes:
            raise ConfigError(f"{path}: principal {entry.id}: default_scope is not among its scopes")
        principal = Principal.from_entry(entry)
        for digest in entry.key_sha256:
            if digest in seen_keys:
                raise ConfigError(f"{path}: a key digest is listed for two principals")
            seen_keys.add(digest)
            out.append((bytes.fromhex(digest), principal))
    return tuple(out)


def _modes(override: ModeOverride) -> dict[Phase, Mode]:
    out: dict[Phase, Mode] = {}
    if override.before_send is not None:
        out[Phase.BEFORE_SEND] = Mode(override.before_send)
    if override.before_release is not None:
        out[Phase.BEFORE_RELEASE] = Mode(override.before_release)
    return out


def _format_set(file: PolicyFile, path: Path, base: Path, private: Private | None = None) -> tuple[FormatSet, bytes]:
    custom: bytes | None = None
    if file.formats.custom_file is not None:
        custom_path = resolve(base, file.formats.custom_file)
        if private is not None:  # it decides what is enforced, as the policy does
            private.guarded(custom_path, "custom format rules")
        try:
            custom = custom_path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: custom rules {custom_path} cannot be read ({exc.strerror})") from None
    try:
        built = build_format_set(
            use_catalogue=file.formats.catalogue,
            disable=file.formats.disable,
            advisory=file.formats.advisory,
            custom=custom,
            detector_modes=file.detectors.model_dump(),
        )
        return built, custom or b""
    except FormatConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_policy(
    path: Path,
    base: Path,
    profiles: dict[str, LoadedProfile],
    max_matches: int,
    private: Private | None = None,
) -> Policy:
    file = _model(PolicyFile, _read_toml(path), str(path))
    for pid in [*file.profile_modes, *file.allow_opaque_profiles]:
        if pid not in profiles:
            raise ConfigError(f"{path}: names unknown profile {pid}")
    for route in file.route_modes:
        if route not in ROUTES:  # a typo would otherwise leave the route on the default mode
            raise ConfigError(f"{path}: route_modes names {route!r}, which is not a provider route {sorted(ROUTES)}")
    values = read_secret_values(file.secret_values.sources, base, file.secret_values.min_length, private)
    # Every resolved provider credential is a literal too, in both phases: a client must not
    # send it, and an upstream that echoes it (in a body or an error) must not release it.
    credentials = [
        literals.SecretValue(lp.credential)
        for lp in profiles.values()
        if lp.credential and "\x00" not in lp.credential and lp.credential not in {v.value for v in values}
    ]
    formats, custom = _format_set(file, path, base, private)
    literal_values = [*values, *dict.fromkeys(credentials)]
    # What the policy decides with, as one digest (in memory only; it names no value).
    content = hashlib.sha256(file.model_dump_json().encode())
    content.update(hashlib.sha256(custom).digest())
    for literal in literal_values:
        content.update(
            hashlib.sha256(f"{int(literal.ignore_case)}{literal.value}".encode("utf-8", "surrogatepass")).digest()
        )
    try:
        engine = build_engine(
            secret_values=literal_values,
            formats=formats,
            policy_version=file.version,
            engine=file.engine,
            max_matches=max_matches,
        )
    except EngineUnavailable as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return Policy(
        version=file.version,
        modes={Phase.BEFORE_SEND: Mode(file.modes.before_send), Phase.BEFORE_RELEASE: Mode(file.modes.before_release)},
        profile_modes={k: _modes(v) for k, v in file.profile_modes.items()},
        route_modes={k: _modes(v) for k, v in file.route_modes.items()},
        allow_opaque_profiles=frozenset(file.allow_opaque_profiles),
        retention_required=frozenset(file.retention_required),
        engine=engine,
        secret_value_count=len(values),
        content_digest=content.hexdigest(),
        prepared_context=file.prepared_context,
        window=stream_window(formats.widths(), literal_values, file.stream_window_cap),
    )


def load_runtime(config_path: Path, *, now: datetime | None = None, generation: int = 0) -> Runtime:
    """Read and compile everything. Raises ConfigError; never returns a partial runtime."""
    now = now or datetime.now(UTC)
    config_path = config_path.resolve()
    base = config_path.parent
    config = read_config(config_path)
    trusted = load_trusted_keys(config.trust.profile_keys, base)
    named = (*config.trust.profile_keys, config.keyring_file, config.profiles_dir)
    refuse_signing_keys_inside(base, trusted, named=[Path(path) for path in named])
    private = Private(base)
    private.guarded(config_path, "configuration")
    for ref in config.trust.profile_keys:
        private.guarded(resolve(base, ref), "trusted profile key")
    profiles = load_profiles(resolve(base, config.profiles_dir), trusted, now, base, private)
    principals_path = resolve(base, config.principals_file)
    principals = load_principals(principals_path, profiles)
    policy_path = resolve(base, config.policy_file)
    private.guarded(policy_path, "policy")
    policy = load_policy(policy_path, base, profiles, config.limits.max_matches, private)
    keyring_path = resolve(base, config.keyring_file)
    private.secret(keyring_path, "binding key ring")
    try:
        keyring = load_keyring(keyring_path)
    except KeyRingError as exc:
        raise ConfigError(f"binding key ring: {exc}") from None
    https = config.server.https
    if https is not None:  # the serving key is a secret; the pair decides who clients trust
        private.secret(resolve(base, https.key), "TLS private key")
        private.guarded(resolve(base, https.cert), "TLS certificate")
    store_dsn = None
    if config.store.dsn is not None:
        store_dsn = read_reference(config.store.dsn, base, "store.dsn", private).strip()
    embeddings = config.context.embeddings_profile
    if embeddings is not None and (
        embeddings not in profiles or "embeddings" not in profiles[embeddings].profile.carriers
    ):
        raise ConfigError(f"{config_path}: context.embeddings_profile {embeddings!r} is not an embeddings profile")
    warnings = private.check(principals_path)
    limits = CarrierLimits(max_depth=config.limits.json_depth, embedded_json_depth=config.limits.embedded_json_depth)
    log_key = keyring.log_key()
    return Runtime(
        config=config,
        base_dir=base,
        profiles=profiles,
        principals=principals,
        policy=policy,
        carrier_limits=limits,
        keyring=keyring,
        generation=generation,
        log_key=log_key,
        store_dsn=store_dsn,
        warnings=warnings,
    )


# The check that no trusted profile-signing private key lies inside the served tree walks it
# lazily and within a bound, and when the bound runs out before the tree does it refuses the
# load (it never passes having read part of the tree). Version-control metadata directories
# are not walked: their objects are compressed (a key committed there cannot be seen by a
# scan for a PEM block anyway) and a checkout's history would spend the bound for nothing.
_KEY_SCAN_MAX_ENTRIES = 5000  # directory entries looked at (files, directories, anything else)
_KEY_SCAN_MAX_BYTES = 64 * 1024  # a PEM private key is far smaller; larger files are not read
_KEY_SCAN_FIRST = ("keys", "secrets")  # where a key is most likely to be dropped: looked at first
_KEY_SCAN_SKIPPED = frozenset({".git", ".hg", ".svn"})


def refuse_signing_keys_inside(
    base: Path, trusted: dict[str, signing.TrustedKey], *, named: Collection[Path] = ()
) -> None:
    """The private half of a trusted profile-signing key must not live in the directory the
    gateway serves from: whoever can read that tree could sign profiles the gateway then
    trusts. Every small file holding a PEM private key is checked.

    The walk is lazy (no listing or sorting of the whole tree up front) and goes where a key
    is most likely first: the directories of the paths the configuration names (`named`),
    then keys/ and secrets/, then the rest. It does not follow symbolic links, skips what it
    cannot read, and does not enter .git, .hg or .svn. It looks at no more than
    _KEY_SCAN_MAX_ENTRIES entries: a tree with more refuses the load (fail closed)."""
    if not trusted:
        return  # no private key can match: nothing to look for
    root = os.path.realpath(base)
    walked: set[str] = set()
    seen = 0
    for top in _key_scan_roots(root, named):
        walked.add(top)
        pending = [top]
        while pending:
            try:
                listing = os.scandir(pending.pop())
            except OSError:
                continue  # a directory the gateway cannot read is skipped, as a file it cannot read is
            with listing:
                for entry in _key_scan_listed(listing):
                    seen += 1
                    if seen > _KEY_SCAN_MAX_ENTRIES:
                        raise ConfigError(_key_scan_bound_message(root))
                    if entry.path in walked:
                        continue  # a directory walked before as a start of its own
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if entry.name not in _KEY_SCAN_SKIPPED:
                                pending.append(entry.path)
                            continue
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        if entry.stat(follow_symlinks=False).st_size > _KEY_SCAN_MAX_BYTES:
                            continue
                    except OSError:
                        continue
                    key_id = _trusted_private_key_id(entry.path, trusted)
                    if key_id is not None:
                        raise ConfigError(
                            f"{entry.path}: the private key of trusted profile-signing key {key_id} is inside the "
                            f"served configuration directory; move it out (wiregate init keeps it in a sibling "
                            f"directory)"
                        )


def _key_scan_listed(listing: Any) -> Any:
    """The entries of an open os.scandir listing; an error while listing ends it (as for a
    directory that cannot be opened) rather than escaping the load as an OSError."""
    while True:
        try:
            entry = next(listing)
        except (StopIteration, OSError):
            return
        yield entry


def _key_scan_roots(root: str, named: Collection[Path]) -> list[str]:
    """Where the scan starts, in order: the directories (inside `root`) of the paths the
    configuration names, keys/, secrets/, and last `root` itself, whose walk skips the
    directories already walked. A directory reached through a symbolic link, inside one
    already listed, or inside version-control metadata is not a start of its own."""
    wanted = [os.path.normpath(os.path.join(root, path)) for path in named]
    wanted = [path if os.path.isdir(path) else os.path.dirname(path) for path in wanted]
    wanted += [os.path.join(root, name) for name in _KEY_SCAN_FIRST]
    roots: list[str] = []
    for path in wanted:
        if not path.startswith(root + os.sep) or path in roots:
            continue
        if _KEY_SCAN_SKIPPED.intersection(Path(os.path.relpath(path, root)).parts):
            continue
        if any(path.startswith(parent + os.sep) for parent in roots):
            continue
        if os.path.realpath(path) != path or not os.path.isdir(path):
            continue
        roots.append(path)
    return [*roots, root]


def _trusted_private_key_id(path: str, trusted: dict[str, signing.TrustedKey]) -> str | None:
    """The key id if `path` is a regular file holding the PEM private half of a trusted key."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        with os.fdopen(os.open(path, flags), "rb") as fh:  # never a link, nor a FIFO that would block
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            data = fh.read(_KEY_SCAN_MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > _KEY_SCAN_MAX_BYTES or b"PRIVATE KEY-----" not in data:
        return None
    key_id = signing.private_key_id(data)
    return key_id if key_id is not None and key_id in trusted else None


def _key_scan_bound_message(root: str) -> str:
    return (
        f"{root}: the served configuration directory holds more than {_KEY_SCAN_MAX_ENTRIES} files and "
        f"directories (.git, .hg and .svn not counted), more than the gateway looks through to make sure no "
        f"trusted profile-signing private key is inside it; the load is refused rather than trusting a tree "
        f"it did not finish checking. Move what the gateway does not need (data, build output, other "
        f"projects) out of this directory"
    )
