"""`[mock_provider]`: the gateway serves the bundled mock provider itself — on loopback only,
started with the app and stopped with it, and readiness waits for it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.config.load import ConfigError, read_config
from gateway.devmock import MOCK_PROVIDER
from gateway.listeners import ListenerError
from gateway.server import start
from tests.conftest import GatewayFactory
from tests.deploy.procs import free_port
from tests.harness import GatewayThread, openai_client, raw_client


def _section(port: int) -> str:
    return f'[mock_provider]\nenabled = true\nport = {port}\napi_key = "file:secrets/upstream.key"\n'


def test_gateway_serves_the_mock_and_stops_it(gateways: GatewayFactory) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with gateways("embedded_mock", mock_url=url, config_extra=_section(port)) as (env, gateway):
        assert gateway.running is not None
        mock = gateway.running.app[MOCK_PROVIDER]
        assert mock.port == port and mock.serving
        sockets = mock.runner.addresses
        assert sockets and all(address[0] == "127.0.0.1" for address in sockets)  # loopback only
        reply = openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content
        assert [r.path for r in mock.state.records()] == ["/v1/chat/completions"]
        assert raw_client(gateway, env).get("/readyz").json() == {"status": "ready"}
        # A mock that stopped serving makes the gateway not ready.
        gateway.call(mock.runner.cleanup())
        mock.stopped = True
        assert raw_client(gateway, env).get("/readyz").status_code == 503
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_an_occupied_port_refuses_to_start(make_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        env = make_env(config_extra=_section(port))
        gateway = GatewayThread(env.config)
        gateway._thread.start()
        try:
            with pytest.raises(ListenerError, match=f"mock provider: cannot listen on 127.0.0.1:{port}"):
                gateway.call(start(env.config, https_port=0, uds_path=tmp_path / "gw.sock"))
        finally:
            gateway.stop()


def test_no_address_but_loopback_can_be_configured(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(config_extra='[mock_provider]\nenabled = true\nhost = "0.0.0.0"\n')
    with pytest.raises(ConfigError, match="mock_provider"):
        read_config(env.config)


def test_off_unless_configured(make_env) -> None:  # type: ignore[no-untyped-def]
    assert read_config(make_env().config).mock_provider.enabled is False
