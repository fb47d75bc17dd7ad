"""Shared fixtures: one mock provider per session, captured JSON logs, env/gateway factories."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx

from gateway.listeners import generate_dev_tls
from gateway.mockprovider import MockProviderServer
from gateway.obs import logging as wlog
from gateway.obs.logging import ALLOWED_FIELDS
from tests.harness import SENSITIVE, SERVED, UPSTREAM_KEY, Env, GatewayThread, build_env


class LogCapture(io.TextIOBase):
    """A thread-safe text sink for the JSON log handler."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf: list[str] = []

    def write(self, s: str) -> int:
        with self._lock:
            self._buf.append(s)
        return len(s)

    def text(self) -> str:
        with self._lock:
            return "".join(self._buf)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines() if line.strip()]

    def mark(self) -> int:
        with self._lock:
            return len(self._buf)

    def since(self, mark: int) -> str:
        with self._lock:
            return "".join(self._buf[mark:])


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}


# Text that only a body, a prompt or a credential header would bring into a log line.
CONTENT_MARKERS = ("mock-scenario:", "Mock reply", "Bearer ", "x-api-key", '"messages"')


def assert_nothing_sensitive(text: str) -> None:
    """No registered sensitive value (in its JSON-escaped forms, and no long line of a
    multi-line one) and no content marker appears in `text`."""
    for value in SENSITIVE:
        for form in _forms(value):
            assert form not in text, "a sensitive value reached a log line"
        for line in value.splitlines():  # parts of multi-line secrets (private keys) too
            if len(line) >= 16:
                assert line not in text, "part of a sensitive value reached a log line"
    for marker in CONTENT_MARKERS:
        assert marker not in text, f"content marker {marker!r} reached a log line"


@pytest.fixture(scope="session", autouse=True)
def captured_logs() -> Iterator[LogCapture]:
    """Every log line of the whole session, checked once at its end (whatever ran, in
    whatever order): every field is allow-listed, no sensitive value or content marker is
    in any line, and there is one access line for every request the in-process gateways
    answered (so the check is never vacuous while gateways ran)."""
    sink = LogCapture()
    # pytest keeps its own exception and warning hooks (it reports those per test); the
    # gateway's own are tested in subprocesses (tests/test_library_logs.py).
    wlog.configure("debug", stream=sink, process_hooks=False)
    yield sink
    records = sink.records()
    for record in records:
        extra = set(record) - ALLOWED_FIELDS - {"ts", "level", "event"}
        assert not extra, f"log fields not on the allow-list: {sorted(extra)}"
    assert_nothing_sensitive(sink.text())
    access_lines = sum(1 for r in records if r.get("event") == "request")
    assert access_lines >= SERVED[0], (access_lines, SERVED[0])


@pytest.fixture(scope="session", autouse=True)
def no_blocking_calls_in_the_event_loop() -> Iterator[None]:
    """Any blocking call (file, socket, sleep, subprocess...) that wiregate's code makes on a
    thread running an event loop raises BlockingError, failing the test that caused it.
    The bundled mock provider (test infrastructure) is not scanned."""
    with blockbuster_ctx(scanned_modules=["gateway"], excluded_modules=["gateway.mockprovider"]):
        yield


@pytest.fixture(scope="session")
def mock() -> Iterator[MockProviderServer]:
    server = MockProviderServer(api_key=UPSTREAM_KEY).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def shared_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    generate_dev_tls(directory)
    return directory


GatewayFactory = Callable[..., contextlib.AbstractContextManager[tuple[Env, GatewayThread]]]


@pytest.fixture(scope="session")
def gateways(mock: MockProviderServer, shared_tls: Path, tmp_path_factory: pytest.TempPathFactory) -> GatewayFactory:
    """The one way a test module gets its own gateway: `with gateways(name, **build_env
    options) as (env, gateway)`, in front of the session's mock provider (or `mock_url`).
    `prepare(env)` runs before the gateway starts (to add principals, say)."""

    @contextlib.contextmanager
    def start(
        name: str, *, mock_url: str | None = None, prepare: Callable[[Env], Any] | None = None, **options: Any
    ) -> Iterator[tuple[Env, GatewayThread]]:
        env = build_env(tmp_path_factory.mktemp(name), mock_url or mock.url, tls_dir=shared_tls, **options)
        if prepare is not None:
            prepare(env)
        with GatewayThread(env.config) as gateway:
            yield env, gateway

    return start


@pytest.fixture
def make_env(tmp_path: Path, mock: MockProviderServer, shared_tls: Path) -> Callable[..., Env]:
    counter = [0]

    def factory(**kw: Any) -> Env:
        counter[0] += 1
        return build_env(tmp_path / f"env{counter[0]}", mock.url, tls_dir=shared_tls, **kw)

    return factory


@pytest.fixture
def gateway_for() -> Iterator[Callable[[Env], GatewayThread]]:
    started: list[GatewayThread] = []

    def factory(env: Env) -> GatewayThread:
        gw = GatewayThread(env.config).start()
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()
