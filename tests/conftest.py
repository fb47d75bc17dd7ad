"""Shared fixtures: one mock provider per session, captured JSON logs, env/gateway factories."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.listeners import generate_dev_tls
from gateway.mockprovider import MockProviderServer
from gateway.obs import logging as wlog
from tests.harness import UPSTREAM_KEY, Env, GatewayThread, build_env


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


@pytest.fixture(scope="session", autouse=True)
def captured_logs() -> LogCapture:
    sink = LogCapture()
    wlog.configure("debug", stream=sink)
    return sink


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
