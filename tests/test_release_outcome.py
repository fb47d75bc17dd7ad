"""before_release as the proxy calls it (`seal=False`: it releases the bytes itself, so no
release binding is made) keeps every check of the API's form: the send binding is opened,
and the release ledger admits one payload per send binding."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.checks import runner
from gateway.checks.claims import ReleaseClaims, open_claims
from gateway.config.load import load_runtime
from gateway.inspection.verdict import decide
from gateway.ledgers.release import MemoryReleaseLedger
from gateway.vocab import Decision, Mode


def _allowed_send(runtime: Any, party: runner.Party) -> str:
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
    given = runner.SendInput(party=party, parsed=(parsed,), body=raw, bound_headers={}, carriers="openai.chat")
    outcome = runner.before_send(runtime, given, route=None)
    assert outcome.verdict.decision is Decision.ALLOW and outcome.binding is not None
    return outcome.binding


def test_an_unsealed_release_still_opens_the_send_binding_and_admits_one_payload(make_env: Any) -> None:
    runtime = load_runtime(make_env().config)
    party = runner.Party("tester", None, "default", runtime.profiles["mock-openai"])
    allow = (decide([], withhold_reasons=[], complete=True, policy_version=runtime.policy.version), Mode.ENFORCE)
    ledger = MemoryReleaseLedger()

    async def release(binding: str, payload: bytes, seal: bool) -> runner.CheckOutcome:
        return await runner.before_release(
            runtime, party, payload, allow, request_binding=binding, ledger=ledger, seal=seal
        )

    async def go() -> None:
        send = _allowed_send(runtime, party)
        unsealed = await release(send, b'{"answer": 1}', seal=False)
        assert unsealed.proceed and unsealed.binding is None and unsealed.valid_until is None
        assert (await release(send, b'{"answer": 1}', seal=False)).proceed  # the same payload again: idempotent
        other = await release(send, b'{"answer": 2}', seal=False)
        assert not other.proceed and other.verdict.reason_codes == ("binding_mismatch",)
        broken = await release(send[:-2] + ("A" if send[-2] != "A" else "B") + send[-1], b"{}", seal=False)
        assert not broken.proceed and broken.verdict.reason_codes == ("binding_invalid",)
        # The API's form seals a release binding naming the same party.
        sealed = await release(_allowed_send(runtime, party), b'{"answer": 3}', seal=True)
        assert sealed.proceed and sealed.binding is not None
        claims = open_claims(
            ReleaseClaims,
            runtime.keyring,
            sealed.binding,
            audience=runtime.config.deployment_id,
            now=0.0,
            principal="tester",
            delegate=None,
            scope="default",
        )
        assert claims.profile_id == "mock-openai"

    asyncio.run(go())
