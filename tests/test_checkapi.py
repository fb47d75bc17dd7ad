"""POST /v1/context/check: phase-strict DTOs, the same decisions as the proxy, and bindings
that cannot be forged, replayed, stretched or moved to another request."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import keyring
from gateway.checks import bindings
from gateway.checks.prepared import BEGIN_MARKER, END_MARKER
from gateway.mockprovider import MockProviderServer
from gateway.state import METRICS
from tests.harness import Env, GatewayThread, build_env, mock_profile, raw_client

SECRET = "sk-check-api-SECRET-42"


@pytest.fixture(scope="module")
def gw(
    mock: MockProviderServer, shared_tls: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("mock-anthropic", "anthropic", mock.url),
        mock_profile("other-openai", "openai", mock.url),
    ]
    env = build_env(
        tmp_path_factory.mktemp("check"), mock.url, tls_dir=shared_tls, secrets_=[SECRET], profiles=profiles
    )
    env.other_key = env.add_principal("other", ["context.check"], ["mock-openai"], ["default", "team-b"])  # type: ignore[attr-defined]
    env.scoped_key = env.add_principal(
        "multi", ["context.check"], ["mock-openai", "other-openai"], ["default", "team-b"]
    )  # type: ignore[attr-defined]
    env.proxy_key = env.add_principal("proxy-only", ["proxy"], ["mock-openai"])  # type: ignore[attr-defined]
    with GatewayThread(env.config) as gateway:
        yield env, gateway


@pytest.mark.parametrize("body", [b"{", b'{"scope_id": "default"}', b"x" * 70_000])
def test_a_key_without_the_action_is_refused_before_its_body_is_read(
    gw: tuple[Env, GatewayThread], body: bytes
) -> None:
    """Known key, no `context.check`: 403 whatever the body (never a 422 that tells it
    what the route would have made of its body)."""
    env, gateway = gw
    r = raw_client(gateway, env).post(
        "/v1/context/check",
        content=body,
        headers={"authorization": f"Bearer {env.proxy_key}", "content-type": "application/json"},  # type: ignore[attr-defined]
    )
    assert r.status_code == 403 and r.json()["error"]["details"]["reason_codes"] == ["forbidden_action"], r.text


def _check(env: Env, gateway: GatewayThread, body: dict[str, Any], *, key: str | None = None, uds: bool = True) -> Any:
    r = raw_client(gateway, env, uds=uds).post(
        "/v1/context/check", json=body, headers={"authorization": f"Bearer {key or env.gateway_key}"}
    )
    return r


CHAT = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]}
REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}, "finish_reason": "stop"}],
}


def _send(body: Any = CHAT, *, scope: str = "default", profile: str = "mock-openai", **extra: Any) -> dict[str, Any]:
    text = body if isinstance(body, str) else json.dumps(body)
    return {
        "scope_id": scope,
        "phase": "before_send",
        "target_profile": profile,
        "payload": {
            "schema": "powercontext.model-json-payload.v1",
            "headers": {"content-type": "application/json"},
            "body": text,
        },
        **extra,
    }


def _release(
    binding: str,
    body: Any = REPLY,
    *,
    scope: str = "default",
    profile: str = "mock-openai",
    sse: bool = False,
    completion: str = "complete",
    **extra: Any,
) -> dict[str, Any]:
    text = body if isinstance(body, str) else json.dumps(body)
    schema = "powercontext.model-sse-payload.v1" if sse else "powercontext.model-json-payload.v1"
    return {
        "scope_id": scope,
        "phase": "before_release",
        "target_profile": profile,
        "request_binding": binding,
        "payload": {"schema": schema, "headers": {}, "body": text},
        "completion": completion,
        **extra,
    }


def _allowed_send(env: Env, gateway: GatewayThread, **kw: Any) -> str:
    r = _check(env, gateway, _send(**kw), key=kw.pop("key", None) if "key" in kw else None)
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["decision"] == "allow", result
    return str(result["binding"])


def test_round_trip(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    r = _check(env, gateway, _send(), uds=False)
    result = r.json()
    assert set(result) == {
        "schema",
        "phase",
        "decision",
        "reason_codes",
        "coverage",
        "policy_version",
        "valid_until",
        "correlate_until",
        "binding",
    }
    assert result["schema"] == "powercontext.context-check.v1" and result["phase"] == "before_send"
    assert result["coverage"] == {"profile": "text-and-tools.v1", "complete": True}
    assert result["policy_version"] == "test-1" and result["valid_until"] < result["correlate_until"]
    rel = _check(env, gateway, _release(result["binding"])).json()
    assert rel["decision"] == "allow" and rel["binding"].startswith("wgb1.")
    assert "correlate_until" not in rel


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(request_binding="x"),  # a release field in a send
        lambda b: b.update(completion="complete"),
        lambda b: b.update(surprise=1),  # unknown field
        lambda b: b.update(phase="before_sending"),
        lambda b: b["payload"].update(schema="powercontext.model-sse-payload.v1"),  # SSE is a release form
        lambda b: b["payload"].update(extra=True),
        lambda b: b.pop("target_profile"),
    ],
)
def test_send_dto_is_strict(gw: tuple[Env, GatewayThread], mutate: Any) -> None:
    env, gateway = gw
    body = _send()
    mutate(body)
    r = _check(env, gateway, body)
    assert r.status_code == 422 and r.json()["error"]["details"]["reason_codes"] == ["invalid_request"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(prepared_contexts=[]),  # a send field in a release
        lambda b: b.pop("completion"),
        lambda b: b.update(completion="partial"),
        lambda b: b.update(usage={"input_tokens": -1}),
        lambda b: b.update(usage={"input_tokens": True}),  # a JSON boolean is not a count
        lambda b: b.update(usage={"output_tokens": "7"}),
        lambda b: b.update(usage={"cache_read_input_tokens": 3.0}),
    ],
)
def test_release_dto_is_strict(gw: tuple[Env, GatewayThread], mutate: Any) -> None:
    env, gateway = gw
    body = _release("wgb1.x.y")
    mutate(body)
    assert _check(env, gateway, body).status_code == 422


def test_secrets_are_decided_the_same_way(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    bad = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"key {SECRET}"}]}
    result = _check(env, gateway, _send(bad)).json()
    assert result["decision"] == "block" and result["reason_codes"] == ["secret_value"] and "binding" not in result
    assert SECRET not in json.dumps(result)
    binding = _allowed_send(env, gateway)
    leaked = {**REPLY, "choices": [{"index": 0, "message": {"role": "assistant", "content": SECRET}}]}
    assert _check(env, gateway, _release(binding, leaked)).json()["reason_codes"] == ["secret_value"]
    stream = (
        "".join(
            f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': SECRET[i : i + 3]}}]})}\n\n"
            for i in range(0, len(SECRET), 3)
        )
        + "data: [DONE]\n\n"
    )
    binding = _allowed_send(env, gateway)
    result = _check(env, gateway, _release(binding, stream, sse=True)).json()
    assert result["decision"] == "block" and result["reason_codes"] == ["secret_value"]


def test_invalid_json_and_incomplete_are_never_allowed(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    result = _check(env, gateway, _send('{"model": "gpt-4.1", "messages": [')).json()
    assert result["decision"] == "withhold" and result["reason_codes"] == ["json_invalid"]
    binding = _allowed_send(env, gateway)
    result = _check(env, gateway, _release(binding, completion="incomplete")).json()
    assert result["decision"] == "withhold" and result["reason_codes"] == ["response_incomplete"]
    binding = _allowed_send(env, gateway)
    cut = 'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'  # no [DONE]
    result = _check(env, gateway, _release(binding, cut, sse=True)).json()
    assert result["decision"] == "withhold" and "response_incomplete" in result["reason_codes"]


def test_every_single_byte_flip_is_refused(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    binding = _allowed_send(env, gateway)
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    for i in range(len(binding)):
        for flip in (0x01, 0x20):
            changed = chr(ord(binding[i]) ^ flip)
            forged = binding[:i] + changed + binding[i + 1 :]
            if forged == binding:
                continue
            r = client.post("/v1/context/check", json=_release(forged), headers=headers)
            result = r.json()
            assert result["decision"] == "withhold", (i, flip)
            assert result["reason_codes"] == ["binding_invalid"], (i, flip, result)
    assert _check(env, gateway, _release(binding)).json()["decision"] == "allow"  # the original still works


def _seal(gateway: GatewayThread, **overrides: Any) -> str:
    assert gateway.running is not None
    runtime = gateway.running.holder.current
    profile = runtime.profiles["mock-openai"]
    now = time.time()
    claims = bindings.new_claims(
        runtime.keyring,
        kind="send",
        audience=runtime.config.deployment_id,
        now=now,
        ttl_s=60,
        phase="before_send",
        sub="tester",
        dlg=None,
        scope="default",
        tp="mock-openai",
        tpd=profile.digest,
        car="openai.chat",
        body="0" * 64,
        hdr="0" * 64,
        pv="test-1",
        dec="allow",
        md="enforce",
        cu=int(now + 600),
    )
    claims.update(overrides)
    return bindings.seal(runtime.keyring, claims)


@pytest.mark.parametrize(
    "overrides,reason",
    [
        ({"cu": int(time.time()) - 1}, "binding_expired"),
        ({"aud": "another-deployment"}, "binding_mismatch"),
        ({"kind": "release"}, "binding_phase"),
        ({"kind": "reuse"}, "binding_phase"),
        ({"sub": "someone-else"}, "binding_mismatch"),
        ({"scope": "team-b"}, "binding_mismatch"),
        ({"tp": "other-openai"}, "binding_mismatch"),
        ({"tpd": "sha256:" + "1" * 64}, "binding_mismatch"),
        ({"dlg": "delegated-user"}, "binding_mismatch"),
        # decided under another policy version: the send's decision no longer holds
        ({"pv": "test-0"}, "binding_mismatch"),
        # not an allow, and not an observed-only send
        ({"dec": "block"}, "binding_mismatch"),
        ({"dec": "withhold", "md": "enforce"}, "binding_mismatch"),
        # incoherent: expires after its correlation deadline, or before it was issued
        ({"exp": int(time.time()) + 10_000}, "binding_invalid"),
        ({"iat": int(time.time()) + 100_000}, "binding_invalid"),
    ],
)
def test_binding_claims(gw: tuple[Env, GatewayThread], overrides: dict[str, Any], reason: str) -> None:
    env, gateway = gw
    result = _check(env, gateway, _release(_seal(gateway, **overrides))).json()
    assert result["decision"] == "withhold" and result["reason_codes"] == [reason]


def test_an_observed_send_binding_may_be_released(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    result = _check(env, gateway, _release(_seal(gateway, dec="block", md="observe"))).json()
    assert result["decision"] == "allow"


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/json", "Authorization": f"Bearer {SECRET}"},
        {"content-type": "application/json", "x-anything-at-all": f"token {SECRET} here"},
        {"content-type": "application/json", SECRET: "1"},
    ],
)
def test_every_supplied_header_is_inspected(gw: tuple[Env, GatewayThread], headers: dict[str, str]) -> None:
    env, gateway = gw
    body = _send()
    body["payload"]["headers"] = headers
    result = _check(env, gateway, body).json()
    assert result["decision"] == "block" and result["reason_codes"] == ["secret_value"]
    release = _release(_allowed_send(env, gateway))
    release["payload"]["headers"] = headers
    result = _check(env, gateway, release).json()
    assert result["decision"] == "block" and result["reason_codes"] == ["secret_value"]


def test_release_binding_is_not_a_send_binding(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    release_binding = _check(env, gateway, _release(_allowed_send(env, gateway))).json()["binding"]
    result = _check(env, gateway, _release(release_binding)).json()
    assert result["reason_codes"] == ["binding_phase"]


def test_another_requests_send_binding(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    key = env.scoped_key  # type: ignore[attr-defined]
    # Issued for scope team-b / profile other-openai / another principal: never for this release.
    for_b = _check(env, gateway, _send(scope="team-b"), key=key).json()["binding"]
    result = _check(env, gateway, _release(for_b, scope="default"), key=key).json()
    assert result["reason_codes"] == ["binding_mismatch"]
    for_other = _check(env, gateway, _send(profile="other-openai"), key=key).json()["binding"]
    assert _check(env, gateway, _release(for_other), key=key).json()["reason_codes"] == ["binding_mismatch"]
    mine = _allowed_send(env, gateway)
    result = _check(env, gateway, _release(mine), key=env.other_key).json()  # type: ignore[attr-defined]
    assert result["reason_codes"] == ["binding_mismatch"]


def test_payload_changed_after_its_allow(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    binding = _allowed_send(env, gateway)
    assert _check(env, gateway, _release(binding)).json()["decision"] == "allow"
    assert _check(env, gateway, _release(binding)).json()["decision"] == "allow"  # same payload: idempotent
    changed = {**REPLY, "choices": [{"index": 0, "message": {"role": "assistant", "content": "something else"}}]}
    result = _check(env, gateway, _release(binding, changed)).json()
    assert result["decision"] == "withhold" and result["reason_codes"] == ["binding_mismatch"]


def test_rotation_and_retired_keys(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    ring = env.dir / "keys" / "bindings-keyring.json"
    old = _allowed_send(env, gateway)
    keyring.rotate_keyring_file(ring)
    assert gateway.reload()
    assert _check(env, gateway, _release(old)).json()["decision"] == "allow"  # still accepted
    newer = _allowed_send(env, gateway)
    assert newer.split(".")[1] != old.split(".")[1]
    keyring.rotate_keyring_file(ring, retire_after=True)
    assert gateway.reload()
    result = _check(env, gateway, _release(_allowed_send(env, gateway))).json()
    assert result["decision"] == "allow"
    old_again = _seal(gateway)  # sealed with the now-active key: fine
    assert _check(env, gateway, _release(old_again)).json()["decision"] == "allow"
    assert _check(env, gateway, _release(newer)).json()["decision"] == "allow"  # accepted (one rotation back)
    first_key_binding = old
    result = _check(env, gateway, _release(first_key_binding, {**REPLY, "id": "other"})).json()
    assert result["reason_codes"] == ["binding_invalid"]  # sealed with a retired key: grants nothing


# --- prepared context replay -----------------------------------------------------------

BLOCK = f'Trust policy text.\n{BEGIN_MARKER}\n{{"trust":"untrusted_history","items":[]}}\n{END_MARKER}'


def _reuse(gateway: GatewayThread, content: str, **overrides: Any) -> str:
    assert gateway.running is not None
    runtime = gateway.running.holder.current
    claims = bindings.new_claims(
        runtime.keyring,
        kind="reuse",
        audience=runtime.config.deployment_id,
        now=time.time(),
        ttl_s=300,
        sub="tester",
        dlg=None,
        scope="default",
        cd="sha256:" + hashlib.sha256(content.encode()).hexdigest(),
        deps=[],
    )
    claims.update(overrides)
    return bindings.seal(runtime.keyring, claims)


def _with_context(prefix: str, block: str, suffix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    text = prefix + block + suffix
    body = {"model": "gpt-4.1", "messages": [{"role": "system", "content": text}, {"role": "user", "content": "q"}]}
    start = len(prefix.encode())
    location = {
        "schema": "powercontext.model-json-text-location.v1",
        "pointer": "/messages/0/content",
        "start_byte": start,
        "end_byte": start + len(block.encode()),
    }
    return body, location


@pytest.mark.parametrize(
    "case,reason",
    [
        ("ok", None),
        ("changed", "prepared_context_mismatch"),
        ("moved", "prepared_context_mismatch"),
        ("bad_pointer", "prepared_context_mismatch"),
        ("mid_character", "prepared_context_mismatch"),
        ("expired", "prepared_context_stale"),
        ("dependencies", "prepared_context_stale"),
        ("other_scope", "prepared_context_mismatch"),
        ("no_wrapper", "prepared_context_mismatch"),
    ],
)
def test_prepared_context_replay(gw: tuple[Env, GatewayThread], case: str, reason: str | None) -> None:
    env, gateway = gw
    block = BLOCK if case != "no_wrapper" else "just some text é"
    body, location = _with_context("Intro ünïcode. ", block, " Outro.")
    overrides: dict[str, Any] = {}
    if case == "expired":
        overrides["exp"] = int(time.time()) - 1
    if case == "dependencies":
        overrides["deps"] = [{"scope": "default", "family": "atomic-memory", "artifact_id": "a1", "revision": 3}]
    if case == "other_scope":
        overrides["scope"] = "team-b"
    binding = _reuse(gateway, block, **overrides)
    if case == "changed":
        body["messages"][0]["content"] = body["messages"][0]["content"].replace(
            "untrusted_history", "trusted_history!!"
        )
    if case == "moved":
        location = {**location, "start_byte": location["start_byte"] + 1, "end_byte": location["end_byte"] + 1}
    if case == "bad_pointer":
        location = {**location, "pointer": "/messages/9/content"}
    if case == "mid_character":
        location = {**location, "start_byte": 7}  # inside "ü"
    result = _check(env, gateway, _send(body, prepared_contexts=[{"binding": binding, "location": location}])).json()
    if reason is None:
        assert result["decision"] == "allow", result
    else:
        assert result["decision"] == "withhold" and reason in result["reason_codes"], result


def test_usage_given_to_a_release_check_is_counted_like_the_proxys(gw: tuple[Env, GatewayThread]) -> None:
    """The usage a host reports with its release check reaches the metrics, not only the
    ledger: the report and Prometheus agree."""
    env, gateway = gw
    assert gateway.running is not None
    tokens = gateway.running.app[METRICS].usage_tokens
    before = tokens.labels("output", "mock-openai", "known")._value.get()
    binding = _allowed_send(env, gateway)
    r = _check(env, gateway, _release(binding, usage={"input_tokens": 11, "output_tokens": 7}))
    assert r.status_code == 200 and r.json()["decision"] == "allow", r.text
    assert tokens.labels("output", "mock-openai", "known")._value.get() == before + 7
    unknown = gateway.running.app[METRICS].usage_unknown.labels("cache_write_5m", "mock-openai")._value.get()
    assert unknown >= 1


def test_a_repeated_release_check_counts_its_usage_once(gw: tuple[Env, GatewayThread]) -> None:
    """One send binding is one provider call: a host that repeats its release check (the
    first answer lost) gets the same answer, and the call's usage is counted once."""
    env, gateway = gw
    assert gateway.running is not None
    tokens = gateway.running.app[METRICS].usage_tokens
    before = tokens.labels("output", "mock-openai", "known")._value.get()
    binding = _allowed_send(env, gateway)
    body = _release(binding, usage={"input_tokens": 11, "output_tokens": 7})
    answers = [_check(env, gateway, body) for _ in range(3)]
    assert all(a.status_code == 200 and a.json()["decision"] == "allow" for a in answers), answers[-1].text
    assert tokens.labels("output", "mock-openai", "known")._value.get() == before + 7
    another = _allowed_send(env, gateway)  # another call: counted on its own
    assert _check(env, gateway, _release(another, usage={"output_tokens": 5})).json()["decision"] == "allow"
    assert tokens.labels("output", "mock-openai", "known")._value.get() == before + 12
