"""Test harness: a real gateway (TLS + UDS) in a background event loop, configured from a
generated directory, in front of the bundled mock provider. No mocking of our own code."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx2
import openai

from gateway import devsetup
from gateway.listeners import generate_dev_tls
from gateway.profiles import signing
from gateway.server import RunningGateway, start

T = TypeVar("T")

UPSTREAM_KEY = "upstream-credential-for-tests-0001"
# Every sensitive value the suite uses — configured secrets, credentials a test creates,
# secrets it sends — so the session's log check can prove none reached a log line.
SENSITIVE: set[str] = {UPSTREAM_KEY}
# Requests the in-process gateways served (from their own metrics), so the log check can
# tell that it saw one access line per request rather than nothing at all.
SERVED: list[int] = [0]


def sensitive(*values: Any) -> None:
    """Register values (strings, or {"value": ...} secret entries) for the log check."""
    for value in values:
        SENSITIVE.add(value["value"] if isinstance(value, dict) else value)


FAST_RETRY = {"attempts": 2, "backoff_initial_ms": 10, "backoff_max_ms": 50, "max_retry_after_s": 5}
FAST_TIMEOUTS = {"connect_s": 2, "read_s": 5, "total_s": 10}


def mock_profile(pid: str, provider: str, mock_url: str, **extra: Any) -> dict[str, Any]:
    base = mock_url + ("/v1" if provider != "anthropic" else "")
    models = ["claude-*"] if provider == "anthropic" else ["gpt-*", "text-embedding-*", "o4-*"]
    doc = devsetup.profile_document(
        id=pid,
        provider=provider,
        base_url=base,
        models=models,
        credential="file:secrets/upstream.key",
        loopback_http=True,
        extra={"retry": dict(FAST_RETRY), "timeouts": dict(FAST_TIMEOUTS)},
    )
    doc.update(extra)
    return doc


def windowed_profiles(url: str) -> list[dict[str, Any]]:
    """The two mock profiles (OpenAI, Anthropic) releasing strict streams windowed."""
    return [
        mock_profile("mock-openai", "openai", url, release="windowed"),
        mock_profile("mock-anthropic", "anthropic", url, release="windowed"),
    ]


SERVICE_TASKS = frozenset({"attribution-purge"})  # long-lived tasks of a running gateway (not left by a call)


@dataclass
class Env:
    """A generated configuration directory."""

    dir: Path
    mock_url: str
    upstream_key: str
    gateway_key: str
    signing_key: Any
    profiles: list[dict[str, Any]] = field(default_factory=list)

    @property
    def config(self) -> Path:
        return self.dir / "wiregate.toml"

    @property
    def ca(self) -> Path:
        return self.dir / "tls" / "ca.pem"

    def write_profile(self, doc: dict[str, Any], *, name: str | None = None) -> Path:
        path = self.dir / "profiles" / f"{name or doc['id']}.json"
        devsetup.write_profile(path, doc, self.signing_key)
        return path

    def write_policy(self, text: str) -> None:
        (self.dir / "policy.toml").write_text(text)

    def write_secrets(self, values: list[Any]) -> None:
        """Configured literals: strings, or {"value": ..., "ignore_case": true} objects."""
        devsetup.write_private(self.dir / "secrets" / "values.json", json.dumps(values).encode())

    def add_principal(self, pid: str, actions: list[str], profiles: list[str], scopes: list[str] | None = None) -> str:
        key, digest = devsetup.new_gateway_key()
        sensitive(key)
        with (self.dir / "principals.toml").open("a") as fh:
            fh.write(devsetup.principal_block(pid, [digest], actions, profiles, scopes))
        return key


ALL_ACTIONS = ["proxy", "context.check", "context.read", "context.prepare", "context.write", "observe", "admin"]


def policy_text(*, version: str = "test-1", extra: str = "", engine: str = "hyperscan") -> str:
    # `extra` goes before the [secret_values] table: its top-level keys stay top-level.
    return (
        f'version = "{version}"\nengine = "{engine}"\n'
        + extra
        + '\n[secret_values]\nsources = ["file:secrets/values.json"]\nmin_length = 8\n'
    )


def build_env(
    directory: Path,
    mock_url: str,
    *,
    secrets_: list[Any] | None = None,
    profiles: list[dict[str, Any]] | None = None,
    principal_profiles: list[str] | None = None,
    policy_extra: str = "",
    config_extra: str = "",
    tls_dir: Path | None = None,
) -> Env:
    directory.mkdir(parents=True, exist_ok=True)
    key_path = devsetup.signing_dir_for(directory) / "profile-signing.key"  # never inside the served tree
    devsetup.new_signing_key(key_path, directory / "keys" / "profile-signing.pub.json")
    skey = signing.load_private_key(key_path.read_bytes())
    devsetup.new_keyring(directory / "keys" / "bindings-keyring.json")
    if tls_dir is not None and (tls_dir / "server.pem").exists():
        shutil.copytree(tls_dir, directory / "tls", dirs_exist_ok=True)
    else:
        generate_dev_tls(directory / "tls")
    upstream_key = UPSTREAM_KEY
    sensitive(*(secrets_ or []))
    devsetup.write_private(directory / "secrets" / "upstream.key", upstream_key.encode())
    env = Env(directory, mock_url, upstream_key, "", skey)
    env.write_secrets(secrets_ or [])
    docs = (
        profiles
        if profiles is not None
        else [
            mock_profile("mock-openai", "openai", mock_url),
            mock_profile("mock-anthropic", "anthropic", mock_url),
        ]
    )
    for doc in docs:
        env.write_profile(doc)
    env.profiles = docs
    devsetup.write_private(directory / "principals.toml", b"")
    env.gateway_key = env.add_principal("tester", ALL_ACTIONS, principal_profiles or [d["id"] for d in docs])
    env.write_policy(policy_text(extra=policy_extra))
    (directory / "wiregate.toml").write_text(
        'deployment_id = "test-deploy"\n'
        '[server.https]\nhost = "127.0.0.1"\nport = 0\n'
        '[server.uds]\npath = "run/gw.sock"\n'
        '[trust]\nprofile_keys = ["keys/profile-signing.pub.json"]\n' + config_extra
    )
    return env


class GatewayThread:
    """The real gateway app on a real TLS socket and a real Unix socket, in its own loop."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self._sockdir = Path(tempfile.mkdtemp(prefix="wg", dir="/tmp"))
        self.uds = self._sockdir / "gw.sock"
        self.running: RunningGateway | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> GatewayThread:
        self._thread.start()
        self.running = self.call(start(self.config, https_port=0, uds_path=self.uds))
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def port(self) -> int:
        assert self.running is not None and self.running.https_port is not None
        return self.running.https_port

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def reload(self) -> bool:
        assert self.running is not None
        return self.call(self.running.reload())

    def pending_tasks(self) -> list[str]:
        """Tasks alive in the gateway's loop, other than the aiohttp server machinery."""

        async def _tasks() -> list[str]:
            me = asyncio.current_task()
            out = []
            for task in asyncio.all_tasks():
                if task is me:
                    continue
                coro = task.get_coro()
                name = getattr(coro, "__qualname__", repr(coro))
                if "RequestHandler.start" in name or "Server" in name or "_serve" in name:
                    continue  # keep-alive connection handlers and listening servers
                if task.get_name() in SERVICE_TASKS:
                    continue  # the gateway's own for its whole life, never a call's
                out.append(name)
            return out

        return self.call(_tasks())

    def served(self) -> int:
        """Requests this gateway answered, by its own metrics (one access line each)."""
        assert self.running is not None
        from gateway.state import METRICS

        registry = self.running.app[METRICS].registry
        return int(
            sum(
                s.value
                for m in registry.collect()
                if m.name == "wiregate_requests"
                for s in m.samples
                if s.name == "wiregate_requests_total"
            )
        )

    def stop(self) -> None:
        if self.running is not None:
            SERVED[0] += self.served()
            self.call(self.running.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- official SDK clients ------------------------------------------------------------


def _tls(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def openai_client(
    gw: GatewayThread, env: Env, *, uds: bool = False, key: str | None = None, **kw: Any
) -> openai.OpenAI:
    if uds:
        http = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(gw.uds)), timeout=30)
        base = "http://localhost/v1"
    else:
        http = httpx2.Client(verify=_tls(env.ca), timeout=30)
        base = gw.https_url + "/v1"
    return openai.OpenAI(
        base_url=base, api_key=key or env.gateway_key, http_client=http, max_retries=kw.pop("max_retries", 0), **kw
    )


def anthropic_client(
    gw: GatewayThread, env: Env, *, uds: bool = False, key: str | None = None, **kw: Any
) -> anthropic.Anthropic:
    if uds:
        http = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(gw.uds)), timeout=30)
        base = "http://localhost"
    else:
        http = httpx2.Client(verify=_tls(env.ca), timeout=30)
        base = gw.https_url
    return anthropic.Anthropic(
        base_url=base, api_key=key or env.gateway_key, http_client=http, max_retries=kw.pop("max_retries", 0), **kw
    )


def direct_openai(mock_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=mock_url + "/v1", api_key=UPSTREAM_KEY, max_retries=0)


def direct_anthropic(mock_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=mock_url, api_key=UPSTREAM_KEY, max_retries=0)


def raw_socket(gw: GatewayThread, env: Env | None = None, listener: str = "uds") -> socket.socket:
    """A connected socket to one of the gateway's listeners (`uds`, or `tls` with the dev CA),
    10 s timeouts, for tests that write HTTP bytes themselves."""
    if listener == "uds":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(gw.uds))
    else:
        assert env is not None, "a TLS socket needs the env's CA"
        raw = socket.create_connection(("127.0.0.1", gw.port))
        sock = ssl.create_default_context(cafile=str(env.ca)).wrap_socket(raw, server_hostname="127.0.0.1")
    sock.settimeout(10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway writes until it closes the connection (a reset counts as closed)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return data
        if not chunk:
            return data
        data += chunk


def read_response(sock: socket.socket) -> tuple[str, dict[str, str], bytes, bytes]:
    """One HTTP/1.1 response read off a raw socket: its status line, headers (lower-cased
    names), body (by its Content-Length) and whatever followed it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    return status, headers, rest[:length], rest[length:]


def raw_client(gw: GatewayThread, env: Env, *, uds: bool = False) -> httpx2.Client:
    if uds:
        return httpx2.Client(transport=httpx2.HTTPTransport(uds=str(gw.uds)), base_url="http://localhost", timeout=30)
    return httpx2.Client(verify=_tls(env.ca), base_url=gw.https_url, timeout=30)


def chat_chunk_event(delta: dict[str, Any], finish: str | None = None) -> str:
    """One OpenAI chat stream event (a mock scenario's `raw_events` entry) with `delta`."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]}) + "\n\n"


def post_json(gw: GatewayThread, env: Env, path: str, body: Any, **headers: str) -> httpx2.Response:
    """POST `body` as JSON over HTTPS with the environment's gateway key (and `headers`)."""
    auth = {"authorization": f"Bearer {env.gateway_key}", **headers}
    return raw_client(gw, env).post(path, json=body, headers=auth)
