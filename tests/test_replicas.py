"""Two gateway processes behind one PostgreSQL and one key ring behave as one gateway (issue 11):
a send binding issued by one releases once on the other and never twice; a reuse binding made
by one verifies on both, and a change on one makes it stale on both; their usage reports agree;
a replica killed mid-call loses nothing it acknowledged and releases nothing unchecked."""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.mockprovider import MockProviderServer
from tests.context.conftest import PG_DSN, drop_schema, require_pg
from tests.deploy import procs
from tests.harness import Env, build_env
from tests.test_context_replay import SYSTEM, _header, _location

WIREGATE = Path(sys.executable).with_name("wiregate")


@dataclass
class Replica:
    name: str
    proc: procs.Proc
    port: int
    env: Env

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.env.ca)),
            headers={"authorization": f"Bearer {self.env.gateway_key}"},
            timeout=30,
        )

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key=self.env.gateway_key,
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(self.env.ca))),
            max_retries=0,
        )


@dataclass
class Pair:
    env: Env
    a: Replica
    b: Replica
    schema: str

    def start(self, name: str, tmp: Path) -> Replica:
        config = self.env.dir / f"wiregate-{name}.toml"
        proc = procs.Proc(
            [str(WIREGATE), "serve", "--config", str(config)],
            {**os.environ, "WIREGATE_STORE_DSN": PG_DSN},
            tmp / f"gateway-{name}.log",
        )
        replica = Replica(name, proc, proc.https_port(), self.env)
        proc.wait_status(lambda: procs.https(replica.port, self.env.ca), "/readyz")
        return replica


@pytest.fixture(scope="module")
def pair(mock: MockProviderServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    require_pg()
    schema = f"replicas_{secrets.token_hex(4)}"
    store = f'\n[store]\nbackend = "postgres"\ndsn = "env:WIREGATE_STORE_DSN"\npg_schema = "{schema}"\n'
    env = build_env(tmp_path_factory.mktemp("replicas"), mock.url, config_extra=store)
    base = env.config.read_text()
    for name in ("a", "b"):  # one configuration directory, one key ring; each its own socket
        (env.dir / f"wiregate-{name}.toml").write_text(
            base.replace('path = "run/gw.sock"', f'path = "run/{name}.sock"')
        )
    logs = tmp_path_factory.mktemp("replica-logs")
    holder = Pair(env, None, None, schema)  # type: ignore[arg-type]
    holder.a = holder.start("a", logs)
    holder.b = holder.start("b", logs)
    try:
        yield holder
    finally:
        for replica in (holder.a, holder.b):
            replica.proc.terminate()
        drop_schema(schema)


CHAT = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]}


def _reply(text: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-" + uuid.uuid4().hex[:8],
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    )


def _check(replica: Replica, body: dict[str, Any]) -> dict[str, Any]:
    with replica.http() as client:
        r = client.post("/v1/context/check", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _send_binding(replica: Replica) -> str:
    result = _check(
        replica,
        {
            "scope_id": "default",
            "phase": "before_send",
            "target_profile": "mock-openai",
            "payload": {
                "schema": "powercontext.model-json-payload.v1",
                "headers": {"content-type": "application/json"},
                "body": json.dumps(CHAT),
            },
        },
    )
    assert result["decision"] == "allow", result
    return str(result["binding"])


def _release(replica: Replica, binding: str, body: str) -> dict[str, Any]:
    return _check(
        replica,
        {
            "scope_id": "default",
            "phase": "before_release",
            "target_profile": "mock-openai",
            "request_binding": binding,
            "payload": {"schema": "powercontext.model-json-payload.v1", "headers": {}, "body": body},
            "completion": "complete",
        },
    )


def test_a_send_binding_releases_once_across_replicas(pair: Pair) -> None:
    binding = _send_binding(pair.a)
    first, other = _reply("the answer"), _reply("another answer")
    assert _release(pair.b, binding, first)["decision"] == "allow"
    assert _release(pair.a, binding, first)["decision"] == "allow", "the same payload again is idempotent"
    for replica in (pair.a, pair.b):
        refused = _release(replica, binding, other)
        assert refused["decision"] != "allow" and refused["reason_codes"] == ["binding_mismatch"], refused


def _ui(replica: Replica, cookie: str | None = None) -> httpx.Client:
    cookies = {"wiregate_ui": cookie} if cookie is not None else None
    return httpx.Client(
        base_url=replica.url,
        verify=ssl.create_default_context(cafile=str(replica.env.ca)),
        cookies=cookies,
        timeout=30,
    )


def test_a_ui_session_made_on_one_replica_opens_and_ends_on_the_other(pair: Pair) -> None:
    """The /ui/ sessions live in the shared database: a load balancer need not be sticky."""
    with _ui(pair.a) as client:
        token = client.post("/ui/login", json={"key": pair.env.gateway_key}).cookies["wiregate_ui"]
    with _ui(pair.b, token) as client:
        opened = client.get("/ui/api/session")
        assert opened.status_code == 200
        assert client.post("/ui/logout", json={}, headers={"x-wiregate-csrf": opened.json()["csrf"]}).status_code == 200
    for replica in (pair.a, pair.b):
        with _ui(replica, token) as client:
            assert client.get("/ui/api/session").status_code == 401, replica.name


def _memory(replica: Replica, scope: str, text: str) -> dict[str, Any]:
    with replica.http() as client:
        r = client.post(
            f"/v1/scopes/{scope}/artifacts",
            json={"family": "atomic-memory", "content": {"kind": "decision", "text": text}},
        )
    assert r.status_code == 201, r.text
    return dict(r.json())


def _scope(replica: Replica) -> str:
    with replica.http() as client:
        r = client.post("/v1/scopes", json={"title": "r", "summary": "r", "idempotency_key": uuid.uuid4().hex})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["scope_id"])


def _replay(replica: Replica, scope: str, prepared: dict[str, Any]) -> Any:
    content = prepared["context"]["content"]
    start, end = _location(SYSTEM, content)
    header = _header(prepared["reuse"]["binding"], "/messages/0/content", start, end)
    return replica.openai().chat.completions.create(
        model="gpt-4.1",
        messages=[
            {"role": "system", "content": SYSTEM + content},
            {"role": "user", "content": "How are amounts stored?"},
        ],
        extra_headers={"x-wiregate-scope": scope, "x-wiregate-prepared-context": header},
    )


def test_a_reuse_binding_verifies_on_both_and_goes_stale_on_both(pair: Pair) -> None:
    scope = _scope(pair.a)
    made = _memory(pair.a, scope, "Billing stores amounts in integer cents.")
    with pair.b.http() as client:  # prepared by the other replica, from the shared store
        prepared = client.post(
            "/v1/context/prepare",
            json={"scope_id": scope, "query": "how are billing amounts stored", "include_reuse": True},
        ).json()
    assert prepared["context"]["status"] == "ready"
    for replica in (pair.a, pair.b):
        assert _replay(replica, scope, prepared).choices[0].message.content
    target = {
        "artifact": {"family": "atomic-memory", "artifact_id": made["artifact_id"], "revision": 1},
        "state_version": 0,
    }
    with pair.b.http() as client:
        r = client.post("/v1/atomic-memory/lifecycle", json={"scope_id": scope, "target": target, "state": "forgotten"})
    assert r.status_code == 200, r.text
    for replica in (pair.a, pair.b):
        with pytest.raises(openai.APIStatusError) as caught:
            _replay(replica, scope, prepared)
        assert "prepared_context_stale" in caught.value.response.text


def _report(replica: Replica) -> dict[str, Any]:
    with replica.http() as client:
        r = client.get("/v1/usage/report")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_usage_reports_agree(pair: Pair) -> None:
    _report(pair.b)  # each replica writes what it has queued when asked
    before = _report(pair.a)["profiles"].get("mock-openai", {}).get("records", 0)
    for n in range(6):
        replica = (pair.a, pair.b)[n % 2]
        replica.openai().chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": f"turn {n}"}])
    _report(pair.a)
    _report(pair.b)
    a, b = _report(pair.a), _report(pair.b)
    assert a["profiles"] == b["profiles"]
    assert a["profiles"]["mock-openai"]["records"] == before + 6


def test_a_scope_postgres_cannot_hold_names_no_scope(pair: Pair) -> None:
    """PostgreSQL text holds no NUL: a scope with one is refused like any scope the caller
    does not reach (it was a 500 from the driver), on every route that looks scopes up."""
    with pair.a.http() as client:
        for scope in ("a\x00b", "\x00"):
            assert client.get("/v1/attribution/report", params={"scope": scope}).status_code == 403
            prepared = client.post("/v1/context/prepare", json={"scope_id": scope, "query": "q", "max_bytes": 4096})
            assert prepared.status_code in (403, 422), prepared.text
        assert client.get("/v1/attribution/report", params={"top": "1.9"}).status_code == 422
        assert client.get("/v1/attribution/report", params={"top": "3"}).status_code == 200


def test_a_replica_killed_mid_call_loses_nothing_acknowledged(
    pair: Pair, mock: MockProviderServer, tmp_path: Path
) -> None:
    scope = _scope(pair.a)
    written = [_memory(pair.a, scope, f"Acknowledged decision number {n}.") for n in range(5)]
    binding = _send_binding(pair.a)
    released = _reply("released by a")
    assert _release(pair.a, binding, released)["decision"] == "allow"
    # A call hangs upstream on replica a; a is SIGKILLed once the upstream has the request.
    sid = "kill" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"fault": "hang"}])
    victim = pair.a

    def kill_when_upstream_waits() -> None:
        if mock.state.wait_for(lambda recs: any(r.scenario == sid for r in recs), timeout=20):
            os.killpg(victim.proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_upstream_waits)
    killer.start()
    body = {**CHAT, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    try:
        with victim.http() as client, pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=body)  # nothing comes back: no partial release
    finally:
        killer.join()
    assert victim.proc.popen.wait(10) == -signal.SIGKILL
    victim.proc.close()
    # Everything a acknowledged is served by b, exactly.
    for n, item in enumerate(written):
        with pair.b.http() as client:
            r = client.get(f"/v1/scopes/{scope}/artifacts/atomic-memory/{item['artifact_id']}/revisions/1")
        assert r.status_code == 200, r.text
        assert r.json()["content"]["text"] == f"Acknowledged decision number {n}."
    assert _release(pair.b, binding, released)["decision"] == "allow"
    assert _release(pair.b, binding, _reply("something else"))["reason_codes"] == ["binding_mismatch"]
    # a comes back on the same database and is one of the pair again.
    pair.a = pair.start("a", tmp_path)
    assert _release(pair.a, binding, _reply("something else"))["reason_codes"] == ["binding_mismatch"]
