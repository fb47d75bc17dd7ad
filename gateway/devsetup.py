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
import hashlib
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway import secretfile
from gateway.listeners import generate_dev_tls
from gateway.profiles import signing

MOCK_PORT = 9901


def write_private(path: Path, data: bytes) -> None:
    secretfile.write_private(path, data)


def new_gateway_key() -> tuple[str, str]:
    """(key, sha256 hex). Keys are 256-bit random; only the digest is ever stored."""
    key = "wg-" + secrets.token_urlsafe(32)
    return key, hashlib.sha256(key.encode()).hexdigest()


def new_signing_key(path: Path, pub_path: Path | None = None) -> tuple[str, str]:
    """Write an Ed25519 private key (PEM, 0600) and its public half (`pub_path`, default
    `<path>.pub.json`); return (key_id, public)."""
    key = signing.new_private_key()
    write_private(path, signing.private_key_pem(key))
    key_id = signing.key_id_for(key.public_key())
    public = signing.public_key_b64(key.public_key())
    if pub_path is None:
        pub_path = path.with_name(path.name.removesuffix(".key") + ".pub.json")
    pub_path.parent.mkdir(parents=True, exist_ok=True)
    pub_path.write_text(json.dumps({"key_id": key_id, "public_key": public}, indent=2) + "\n")
    return key_id, public


def signing_dir_for(directory: Path) -> Path:
    """Where `init` keeps the profile-signing private key: beside the served configuration
    directory, never inside it (the gateway refuses to start if it finds it there)."""
    return directory.parent / f"{directory.name}-signing"


def new_keyring(path: Path) -> str:
    """A binding key ring with one active 256-bit key (ChaCha20-Poly1305)."""
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
    write_private(path, (json.dumps(ring, indent=2) + "\n").encode())
    return key_id


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
    signed = signing.sign(document, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(signed, indent=2) + "\n")


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
    """Create a working directory. Refuses to overwrite an existing config unless forced.
    Returns facts for the CLI to print (including the dev gateway key, once)."""
    directory = directory.resolve()
    config = directory / "wiregate.toml"
    if config.exists() and not force:
        raise FileExistsError(f"{config} already exists (use --force to regenerate)")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run").mkdir(exist_ok=True, mode=0o750)
    signing_path = signing_dir_for(directory) / "profile-signing.key"
    key_id, _ = new_signing_key(signing_path, directory / "keys" / "profile-signing.pub.json")
    signing_key = signing.load_private_key(signing_path.read_bytes())
    for doc in example_profiles(mock_port):
        write_profile(directory / "profiles" / f"{doc['id']}.json", doc, signing_key)
    new_keyring(directory / "keys" / "bindings-keyring.json")
    ca, _, _ = generate_dev_tls(directory / "tls")
    write_private(directory / "secrets" / "secret-values.txt", b"")
    write_private(directory / "secrets" / "mock-upstream.key", secrets.token_hex(24).encode() + b"\n")
    gateway_key, digest = new_gateway_key()
    write_private(directory / "dev-gateway-key", gateway_key.encode() + b"\n")
    write_private(
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
    )
    (directory / "policy.toml").write_text(POLICY_TEMPLATE)
    config.write_text(
        CONFIG_TEMPLATE.format(deployment_id="dev-" + secrets.token_hex(4), https_port=https_port, mock_port=mock_port)
    )
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
