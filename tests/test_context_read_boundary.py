"""Every read boundary applies the current rules (RFC 2086; SPEC §6.3: configured values are
never echoed): a value configured after a memory holding it was stored is not returned by
any read or by prepare — the read is withheld whole with reason codes only — while reads of
other memories go on, and the value is readable again once it is no longer configured."""

from __future__ import annotations

import uuid
from typing import Any

import httpx2
import pytest

from gateway.context.service import ContextService
from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, raw_client, sensitive

LATE = "zq-live-configured-later-7781"
OTHER = "an-unrelated-configured-value-4412"


def _api(env: Env, gw: GatewayThread, method: str, path: str, body: Any = None) -> httpx2.Response:
    return raw_client(gw, env).request(method, path, json=body, headers={"authorization": f"Bearer {env.gateway_key}"})


def test_a_value_configured_after_it_was_stored_is_never_read_back(
    gateways: GatewayFactory, captured_logs: LogCapture
) -> None:
    sensitive(LATE)
    with gateways("context-read-boundary", secrets_=[OTHER]) as (env, gw):
        made = _api(env, gw, "POST", "/v1/scopes", {"title": "b", "summary": "b", "idempotency_key": uuid.uuid4().hex})
        assert made.status_code in (200, 201), made.text
        scope = made.json()["scope_id"]
        texts = [f"Billing stores amounts in integer cents; the ledger key is {LATE}.", "Invoices are due in 30 days."]
        ids = []
        for text in texts:
            art = _api(
                env,
                gw,
                "POST",
                f"/v1/scopes/{scope}/artifacts",
                {"family": "atomic-memory", "content": {"kind": "decision", "text": text}},
            )
            assert art.status_code == 201, art.text
            ids.append(art.json()["artifact_id"])
        base = f"/v1/scopes/{scope}/artifacts/atomic-memory"
        prepare = {"scope_id": scope, "query": "how are billing amounts stored", "include_reuse": True}
        reads = [
            ("GET", f"{base}/{ids[0]}", None),
            ("GET", f"{base}/{ids[0]}/revisions/1", None),
            ("POST", "/v1/atomic-memory/list", {"scope_id": scope}),
            ("POST", "/v1/atomic-memory/search", {"scope_id": scope, "query": "billing ledger key"}),
            ("POST", f"/v1/scopes/{scope}/artifacts/atomic-memory/search", {"query": "billing ledger key"}),
            ("POST", "/v1/context/prepare", prepare),
        ]
        for method, path, body in reads:  # before: stored and read back as any memory
            r = _api(env, gw, method, path, body)
            assert r.status_code == 200 and LATE in r.text, (path, r.status_code, r.text[:200])

        env.write_secrets([OTHER, LATE])
        assert gw.reload()
        mark = captured_logs.mark()
        for method, path, body in reads:
            r = _api(env, gw, method, path, body)
            assert r.status_code == 403, (path, r.status_code, r.text[:200])
            error = r.json()["error"]
            assert error["code"] == "memory_read_withheld"
            assert error["details"] == {"reason_codes": ["secret_value"]}
            assert LATE not in r.text
        assert LATE not in captured_logs.since(mark)
        assert "memory_read_withheld" in captured_logs.since(mark)
        other = _api(env, gw, "GET", f"{base}/{ids[1]}")  # the other memory is read as before
        assert other.status_code == 200 and texts[1] in other.text

        env.write_secrets([OTHER])
        assert gw.reload()
        r = _api(env, gw, "GET", f"{base}/{ids[0]}")
        assert r.status_code == 200 and LATE in r.text


def test_changes_that_answer_with_records_read_them_first(gateways: GatewayFactory) -> None:
    """Forget and merge answer with the records they change: a record holding a value
    configured since is not returned that way either, and nothing changes."""
    sensitive(LATE)
    with gateways("context-read-boundary-changes", secrets_=[OTHER]) as (env, gw):
        made = _api(env, gw, "POST", "/v1/scopes", {"title": "b", "summary": "b", "idempotency_key": uuid.uuid4().hex})
        scope = made.json()["scope_id"]
        refs = []
        for text in (f"The ledger key is {LATE}.", "Invoices are due in 30 days."):
            memory = {"family": "atomic-memory", "content": {"kind": "decision", "text": text}}
            art = _api(env, gw, "POST", f"/v1/scopes/{scope}/artifacts", memory).json()
            refs.append({"family": "atomic-memory", "artifact_id": art["artifact_id"], "revision": 1})
        env.write_secrets([OTHER, LATE])
        assert gw.reload()
        state = _api(env, gw, "GET", f"/v1/scopes/{scope}/artifacts/atomic-memory/{refs[0]['artifact_id']}/state")
        version = state.json()["state_version"]
        target = {"artifact": refs[0], "state_version": version}
        changes = [
            ("/v1/atomic-memory/lifecycle", {"scope_id": scope, "target": target, "state": "forgotten"}),
            (
                "/v1/atomic-memory/merges",
                {
                    "scope_id": scope,
                    "inputs": [target, {"artifact": refs[1], "state_version": 0}],
                    "content": {"kind": "decision", "text": "Merged: invoices are due in 30 days."},
                },
            ),
        ]
        for path, body in changes:
            r = _api(env, gw, "POST", path, body)
            assert r.status_code == 403, (path, r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == "memory_read_withheld" and LATE not in r.text
        after = _api(env, gw, "GET", f"/v1/scopes/{scope}/artifacts/atomic-memory/{refs[0]['artifact_id']}/state")
        assert after.json()["state_version"] == version  # nothing changed


def test_prepare_is_read_as_its_stored_items_not_its_cut_text(gateways: GatewayFactory) -> None:
    """Prepare cuts a long item and appends an ellipsis: the read check takes the stored
    items, so a cut that leaves a credential-shaped tail (37 hex digits alone) is no
    refusal, while a value configured since in any item still is."""
    with gateways("context-read-boundary-cut", secrets_=[OTHER]) as (env, gw):
        made = _api(env, gw, "POST", "/v1/scopes", {"title": "b", "summary": "b", "idempotency_key": uuid.uuid4().hex})
        scope = made.json()["scope_id"]
        prose = ("Release notes: the billing service was rebuilt after review. " * 40)[:1959] + " "
        digest = "9f2c4be1d07a3356c8e2f1a94b7d60e3c5a8f91b2d4e6c7a0b1c2d3e4f5a6b7c"
        text = prose + digest + " is the checksum of the billing release build."
        memory = {"family": "atomic-memory", "content": {"kind": "decision", "text": text}}
        assert _api(env, gw, "POST", f"/v1/scopes/{scope}/artifacts", memory).status_code == 201
        r = _api(env, gw, "POST", "/v1/context/prepare", {"scope_id": scope, "query": "billing release checksum"})
        assert r.status_code == 200, r.text
        assert "…" in r.json()["content"] and digest[:30] in r.json()["content"] and digest not in r.json()["content"]


def test_the_read_before_a_change_costs_the_inputs_it_names(
    gateways: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge that repeats one input is refused before any is read (409, as the change
    itself refuses it); inputs that do not exist, or name a revision past the head (one no
    store can hold included), are not read one by one, and never fail the change with a 500."""
    reads: list[int] = []
    read = ContextService.get_artifact_revision

    async def counted(self: ContextService, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return await read(self, *args, **kwargs)

    monkeypatch.setattr(ContextService, "get_artifact_revision", counted)
    with gateways("context-read-boundary-cost") as (env, gw):
        made = _api(env, gw, "POST", "/v1/scopes", {"title": "c", "summary": "c", "idempotency_key": uuid.uuid4().hex})
        scope = made.json()["scope_id"]
        memory = {"family": "atomic-memory", "content": {"kind": "decision", "text": "Invoices are due in 30 days."}}
        art = _api(env, gw, "POST", f"/v1/scopes/{scope}/artifacts", memory).json()["artifact_id"]
        ref: dict[str, Any] = {"family": "atomic-memory", "artifact_id": art, "revision": 1}
        given = {"artifact": ref, "state_version": 0}
        content = {"kind": "decision", "text": "Merged."}
        repeated = _api(
            env,
            gw,
            "POST",
            "/v1/atomic-memory/merges",
            {"scope_id": scope, "inputs": [given] * 500, "content": content},
        )
        assert repeated.status_code == 409 and repeated.json()["error"]["code"] == "invalid_memory_relation"
        assert reads == []
        invented = [
            {
                "artifact": {"family": "atomic-memory", "artifact_id": uuid.uuid4().hex, "revision": 1},
                "state_version": 0,
            }
            for _ in range(200)
        ]
        missing = _api(
            env,
            gw,
            "POST",
            "/v1/atomic-memory/merges",
            {"scope_id": scope, "inputs": [given, *invented], "content": content},
        )
        assert missing.status_code == 404, missing.text[:200]
        assert len(reads) == 1  # the one input that exists
        for revision in (2**62, 2**63, 2**64 + 1):
            past = {"artifact": {**ref, "revision": revision}, "state_version": 0}
            changes = [
                ("/v1/atomic-memory/lifecycle", {"scope_id": scope, "target": past, "state": "forgotten"}),
                ("/v1/atomic-memory/merges", {"scope_id": scope, "inputs": [past, invented[0]], "content": content}),
            ]
            for path, body in changes:
                r = _api(env, gw, "POST", path, body)
                assert r.status_code in (404, 409), (path, revision, r.status_code, r.text[:200])
        assert len(reads) == 1
        state = _api(env, gw, "GET", f"/v1/scopes/{scope}/artifacts/atomic-memory/{art}/state").json()
        assert state["state"] == "active" and state["state_version"] == 0  # nothing changed
