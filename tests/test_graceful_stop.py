"""Graceful stop and readiness (issue 11): on SIGTERM /readyz turns 503 first, a call in
flight finishes whole, the process exits 0; readiness also reflects the store."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.mockprovider import MockProviderServer
from gateway.state import DATABASE
from tests.conftest import GatewayFactory
from tests.deploy import procs
from tests.harness import Env, GatewayThread, build_env, raw_client

WIREGATE = Path(sys.executable).with_name("wiregate")


def test_sigterm_drains_then_finishes_the_call_in_flight(mock: MockProviderServer, tmp_path: Path) -> None:
    env = build_env(tmp_path / "gw", mock.url, config_extra="[server]\ndrain_s = 1.5\nshutdown_grace_s = 20\n")
    proc = procs.Proc([str(WIREGATE), "serve", "--config", str(env.config)], dict(os.environ), tmp_path / "gateway.log")
    sock = env.dir / "run" / "gw.sock"
    text = "".join(f"w{n} " for n in range(40))
    sid = "drain" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"text": text, "chunk_size": 4, "drip_ms": 60}])  # ~40 events, ~2.4 s
    got: dict[str, Any] = {}

    def call() -> None:
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=30) as client:
            r = client.post(
                "/v1/chat/completions",
                json={
                    "model": "gpt-4.1",
                    "stream": True,
                    "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
                },
                headers={"authorization": f"Bearer {env.gateway_key}"},
            )
            got["status"], got["body"] = r.status_code, r.text

    try:
        proc.wait_status(lambda: procs.uds(sock), "/readyz")
        caller = threading.Thread(target=call)
        caller.start()
        assert mock.state.wait_for(lambda recs: any(r.scenario == sid for r in recs), timeout=20)
        proc.popen.send_signal(signal.SIGTERM)
        body = proc.wait_status(lambda: procs.uds(sock), "/readyz", want=503, timeout=10)
        assert json.loads(body) == {"status": "draining"}
        caller.join(30)
        assert not caller.is_alive()
        assert got["status"] == 200, got
        chunks = [json.loads(line[6:]) for line in got["body"].splitlines() if line.startswith("data: {")]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text
        assert "data: [DONE]" in got["body"]
        assert proc.popen.wait(30) == 0
        assert "draining" in [r.get("event") for r in proc.records()]
    finally:
        proc.close()


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("readiness") as started:
        yield started


def test_readiness_reflects_the_store(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    client = raw_client(gateway, env)
    assert client.get("/readyz").json() == {"status": "ready"}
    assert gateway.running is not None
    database = gateway.running.app[DATABASE]
    assert database.sqlite is not None
    gateway.call(database.sqlite.close())  # the store goes away under a running gateway
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json() == {"status": "not_ready", "reason": "store_unreachable"}
    assert client.get("/healthz").status_code == 200  # alive, just not ready
