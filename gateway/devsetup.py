"""First-run set-up: a complete, working configuration directory for development.

Owns: `wiregate init` — a config, a policy, principals with one dev key, a profile-signing
key, signed example profiles (OpenAI, Anthropic, and the bundled mock provider), a binding
key ring, a dev CA + server certificate, and the bundled mock provider enabled on the
port the mock profiles point at — and the profile documents `wiregate profiles
new` writes. Private material is written 0600 and printed never (the dev gateway key is
printed once and kept in a 0600 file for the README's examples).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway import secretfile
from gateway.listeners import generate_dev_tls
from gateway.profiles import signing

MOCK_PORT = 9901


def write_private(path: Path, data: bytes) -> None:
    secretfile.write_private(path, data)


def write_new(path: Path, data: bytes, *, private: bool = False) -> None:
    """`data` in a file created at `path` exclusively (O_EXCL): FileExistsError if anything is
    there already, a dangling symbolic link included, so nothing is ever replaced. A private
    file is 0600 from its creation. A file this could not finish writing is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600 if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if private:
                os.fchmod(fh.fileno(), 0o600)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def new_gateway_key() -> tuple[str, str]:
    """(key, sha256 hex). Keys are 256-bit random; only the digest is ever stored."""
    key = "wg-" + secrets.token_urlsafe(32)
    return key, hashlib.sha256(key.encode()).hexdigest()


def new_signing_key(path: Path, pub_path: Path | None = None) -> tuple[str, str]:
    """Write an Ed25519 private key (PEM, 0600) and its public half (`pub_path`, default
    `<path>.pub.json`); return (key_id, public)."""
    key = signing.new_private_key()
    write_private(path, signing.private_key_pem(key))
    key_id, public = signing.key_id_for(key.public_key()), signing.public_key_b64(key.public_key())
    if pub_path is None:
        pub_path = path.with_name(path.name.removesuffix(".key") + ".pub.json")
    pub_path.parent.mkdir(parents=True, exist_ok=True)
    pub_path.write_bytes(_public_key_document(key))
    return key_id, public


def _public_key_document(key: Any) -> bytes:
    """The trusted-key file for `key`'s public half (`[trust] profile_keys` lists it)."""
    key_id, public = signing.key_id_for(key.public_key()), signing.public_key_b64(key.public_key())
    return (json.dumps({"key_id": key_id, "public_key": public}, indent=2) + "\n").encode()


def signing_dir_for(directory: Path) -> Path:
    """Where `init` keeps the profile-signing private key: beside the served configuration
    directory, never inside it (the gateway refuses to start if it finds it there)."""
    return directory.parent / f"{directory.name}-signing"


def new_keyring(path: Path) -> str:
    """A binding key ring with one active 256-bit key (ChaCha20-Poly1305)."""
    key_id, data = keyring_document()
    write_private(path, data)
    return key_id


def keyring_document() -> tuple[str, bytes]:
    """(active key id, the key ring file's bytes) for a new binding key ring."""
    key_id = "k-" + secrets.token_hex(4)
    ring = {
        "version": 1,
        "active": key_id,
        "keys": [
            {
                "id": key_id,
                "secret": base64.b64encode(secrets.token_bytes(32)).decode(),
                "state": "active",
                "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
        "digest_secret": base64.b64encode(secrets.token_bytes(32)).decode(),  # keys digests; never rotates
    }
    return key_id, (json.dumps(ring, indent=2) + "\n").encode()


def profile_document(
    *,
    id: str,
    provider: str,
    base_url: str,
    models: list[str],
    credential: str,
    carriers: list[str] | None = None,
    loopback_http: bool = False,
    fallbacks: list[str] | None = None,
    expires: str | None = None,
    version: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if carriers is None:
        carriers = ["messages"] if provider == "anthropic" else ["chat", "responses", "embeddings"]
    doc: dict[str, Any] = {
        "id": id,
        "version": version,
        "provider": provider,
        "carriers": carriers,
        "base_url": base_url,
        "models": models,
        "credential": credential,
        "cache": (
            {"mode": "anthropic-cache-control", "max_breakpoints": 4, "min_prefix_tokens": 1024, "ttl": "5m"}
            if provider == "anthropic"
            else {"mode": "openai-prompt-cache-key", "min_prefix_tokens": 1024}
        ),
        # Usage figures the target really reports; any other figure is treated as unknown.
        "usage_fields": (
            [
                "input_tokens",
                "output_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
                "ephemeral_5m_input_tokens",
                "ephemeral_1h_input_tokens",
                "thinking_tokens",
            ]
            if provider == "anthropic"
            else [
                "prompt_tokens",
                "completion_tokens",
                "input_tokens",
                "output_tokens",
                "cached_tokens",
                "cache_write_tokens",
                "reasoning_tokens",
            ]
        ),
        "context_window": 200000 if provider == "anthropic" else 128000,
    }
    if loopback_http:
        doc["loopback_http"] = True
    if fallbacks:
        doc["fallbacks"] = fallbacks
    if provider == "anthropic":
        doc["passthrough_headers"] = ["anthropic-beta"]
    if expires:
        doc["expires"] = expires
    doc.update(extra or {})
    return doc


def example_profiles(mock_port: int = MOCK_PORT) -> list[dict[str, Any]]:
    return [
        profile_document(
            id="openai",
            provider="openai",
            base_url="https://api.openai.com/v1",
            models=["gpt-*", "o1*", "o3*", "o4*", "chatgpt-*", "text-embedding-*"],
            credential="env:OPENAI_API_KEY",
            extra={"retention": "provider-default"},
        ),
        profile_document(
            id="anthropic",
            provider="anthropic",
            base_url="https://api.anthropic.com",
            models=["claude-*"],
            credential="env:ANTHROPIC_API_KEY",
            extra={"retention": "provider-default"},
        ),
        profile_document(
            id="mock-openai",
            provider="openai",
            base_url=f"http://127.0.0.1:{mock_port}/v1",
            models=["mock-gpt-*", "mock-embed-*"],
            credential="file:secrets/mock-upstream.key",
            loopback_http=True,
        ),
        profile_document(
            id="mock-anthropic",
            provider="anthropic",
            base_url=f"http://127.0.0.1:{mock_port}",
            models=["mock-claude-*"],
            credential="file:secrets/mock-upstream.key",
            loopback_http=True,
        ),
    ]


def write_profile(path: Path, document: dict[str, Any], key: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_signed_profile(document, key))


def _signed_profile(document: dict[str, Any], key: Any) -> bytes:
    return (json.dumps(signing.sign(document, key), indent=2) + "\n").encode()


CONFIG_TEMPLATE = """\
# wiregate configuration (generated by `wiregate init`). Paths are relative to this file.
deployment_id = "{deployment_id}"
profiles_dir = "profiles"
principals_file = "principals.toml"
policy_file = "policy.toml"
keyring_file = "keys/bindings-keyring.json"

[server.https]
host = "127.0.0.1"
port = {https_port}
cert = "tls/server.pem"
key = "tls/server.key"

[server.uds]
path = "run/wiregate.sock"
mode = "0660"

[trust]
profile_keys = ["keys/profile-signing.pub.json"]

[limits]
# Every limit refuses explicitly when exceeded; see README "Limits" for what each protects.
request_bytes = 33554432
decompressed_request_bytes = 33554432
response_bytes = 67108864
buffer_seconds = 600
concurrent_buffered_responses = 256
json_depth = 64

[logging]
level = "info"

[mock_provider]
# The bundled mock provider, served by the gateway itself on 127.0.0.1 (the mock-* profiles
# point at this port). Set enabled = false once you only use real providers.
enabled = true
port = {mock_port}
api_key = "file:secrets/mock-upstream.key"
"""

POLICY_TEMPLATE = """\
# wiregate policy (generated by `wiregate init`). Bump `version` on every change.
version = "dev-1"
engine = "hyperscan"

[modes]
before_send = "enforce"
before_release = "enforce"

[secret_values]
# One value per line in each file (or a JSON list for *.json); env sources are newline-separated.
sources = ["file:secrets/secret-values.txt"]
min_length = 8
"""


HTTPS_PORT = 8443


def init(
    directory: Path, *, force: bool = False, https_port: int = HTTPS_PORT, mock_port: int = MOCK_PORT
) -> dict[str, Any]:
    """Create a working directory. Returns facts for the CLI to print (including the dev
    gateway key, once).

    Without `force` it writes over nothing: if any file it would write is there already
    (the profile-signing key in the sibling `<dir>-signing/` included) it raises
    FileExistsError before writing anything, and it creates every file exclusively, so one
    that appears meanwhile is not replaced either (the run stops and removes the files it had
    created). With `force` it regenerates them all: a new signing key, key ring, dev gateway
    key and dev CA."""
    directory = directory.resolve()
    config = directory / "wiregate.toml"
    signing_path = signing_dir_for(directory) / "profile-signing.key"
    if not force:
        present = [path for path in init_files(directory, mock_port) if os.path.lexists(path)]
        if present:
            raise FileExistsError(_already_there(present))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run").mkdir(exist_ok=True, mode=0o750)
    signing_key = signing.new_private_key()
    key_id = signing.key_id_for(signing_key.public_key())
    gateway_key, digest = new_gateway_key()
    files = _InitFiles(replace=force)
    try:
        files.write(signing_path, signing.private_key_pem(signing_key), private=True)
        files.write(directory / "keys" / "profile-signing.pub.json", _public_key_document(signing_key))
        for doc in example_profiles(mock_port):
            files.write(directory / "profiles" / f"{doc['id']}.json", _signed_profile(doc, signing_key))
        files.write(directory / "keys" / "bindings-keyring.json", keyring_document()[1], private=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".wiregate-init-tls-") as made:
            ca_made, cert_made, key_made = generate_dev_tls(Path(made))  # 0700 directory, gone after
            ca = directory / "tls" / "ca.pem"
            files.write(ca, ca_made.read_bytes())
            files.write(directory / "tls" / "server.pem", cert_made.read_bytes())
            files.write(directory / "tls" / "server.key", key_made.read_bytes(), private=True)
        files.write(directory / "secrets" / "secret-values.txt", b"", private=True)
        files.write(directory / "secrets" / "mock-upstream.key", secrets.token_hex(24).encode() + b"\n", private=True)
        files.write(directory / "dev-gateway-key", gateway_key.encode() + b"\n", private=True)
        files.write(
            directory / "principals.toml",
            (
                "# Principals: gateway keys are stored as sha256 digests only.\n"
                + principal_block(
                    "dev",
                    [digest],
                    ["proxy", "context.check", "context.read", "context.prepare", "context.write", "observe", "admin"],
                    ["mock-openai", "mock-anthropic", "openai", "anthropic"],
                )
            ).encode(),
            private=True,
        )
        files.write(directory / "policy.toml", POLICY_TEMPLATE.encode())
        files.write(
            config,
            CONFIG_TEMPLATE.format(
                deployment_id="dev-" + secrets.token_hex(4), https_port=https_port, mock_port=mock_port
            ).encode(),
        )
    except BaseException:
        files.undo()
        raise
    return {
        "dir": str(directory),
        "config": str(config),
        "ca": str(ca),
        "gateway_key": gateway_key,
        "signing_key_id": key_id,
        "signing_key": str(signing_path),
        "socket": str(directory / "run" / "wiregate.sock"),
        "https": f"https://127.0.0.1:{https_port}",
        "mock_provider": f"http://127.0.0.1:{mock_port}",
    }


def init_files(directory: Path, mock_port: int = MOCK_PORT) -> list[Path]:
    """Every file `init` writes for `directory` (resolved), in the order it writes them."""
    return [
        signing_dir_for(directory) / "profile-signing.key",
        directory / "keys" / "profile-signing.pub.json",
        *(directory / "profiles" / f"{doc['id']}.json" for doc in example_profiles(mock_port)),
        directory / "keys" / "bindings-keyring.json",
        directory / "tls" / "ca.pem",
        directory / "tls" / "server.pem",
        directory / "tls" / "server.key",
        directory / "secrets" / "secret-values.txt",
        directory / "secrets" / "mock-upstream.key",
        directory / "dev-gateway-key",
        directory / "principals.toml",
        directory / "policy.toml",
        directory / "wiregate.toml",
    ]


def _already_there(present: list[Path]) -> str:
    shown = ", ".join(str(path) for path in present[:4])
    if len(present) > 4:
        shown += f" and {len(present) - 4} more"
    return (
        f"{shown} already exist{'s' if len(present) == 1 else ''}; nothing was written (use --force to "
        f"regenerate: a new profile-signing key, binding key ring and dev gateway key replace the old ones)"
    )


class _InitFiles:
    """Writes `init`'s files. `replace` (--force): each one replaced, secrets into fresh 0600
    files (secretfile.write_private). Otherwise each one created exclusively (write_new); a
    file found there stops the run, and `undo` removes the files this run created."""

    def __init__(self, *, replace: bool) -> None:
        self.replace = replace
        self.created: list[Path] = []

    def write(self, path: Path, data: bytes, *, private: bool = False) -> None:
        if self.replace:
            if private:
                write_private(path, data)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return
        try:
            write_new(path, data, private=private)
        except FileExistsError:
            raise FileExistsError(
                f"{path} appeared while init was writing; the files this run created were removed and "
                f"nothing else changed (use --force to regenerate)"
            ) from None
        self.created.append(path)

    def undo(self) -> None:
        for path in reversed(self.created):
            with contextlib.suppress(OSError):
                path.unlink()
        self.created.clear()


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def principal_block(
    principal_id: str,
    digests: list[str],
    actions: list[str],
    profiles: list[str],
    scopes: list[str] | None = None,
) -> str:
    scopes = scopes or ["default"]
    return (
        "\n[[principal]]\n"
        f"id = {json.dumps(principal_id)}\n"
        'type = "service"\n'
        f"key_sha256 = {_toml_list(digests)}\n"
        f"actions = {_toml_list(actions)}\n"
        f"profiles = {_toml_list(profiles)}\n"
        f"scopes = {_toml_list(scopes)}\n"
        f"default_scope = {json.dumps(scopes[0])}\n"
    )
