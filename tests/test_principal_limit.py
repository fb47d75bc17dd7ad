"""One principal cannot take every slot (issue 7 item 15): past `per_principal_concurrent`
provider calls in flight, that principal's next call gets 429 `rate_limited` at once with a
retry hint, while another principal's call still goes through; the slot frees when the call
ends."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import openai
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import ALL_ACTIONS, Env, GatewayThread, openai_client


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread, str]]:
    keys: dict[str, str] = {}

    def second_principal(env: Env) -> None:
        keys["other"] = env.add_principal("other", ALL_ACTIONS, [d["id"] for d in env.profiles])

    with gateways(
        "principal-limit", config_extra="[limits]\nper_principal_concurrent = 1\n", prepare=second_principal
    ) as (env, gateway):
        yield env, gateway, keys["other"]


def test_a_principal_past_its_limit_is_told_to_retry_and_others_are_not(
    gw: tuple[Env, GatewayThread, str], mock: MockProviderServer
) -> None:
    env, gateway, other_key = gw
    sid = "slow" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"text": "late answer", "delay_ms": 1500}])
    holder: dict[str, object] = {}

    def hold_the_slot() -> None:
        holder["reply"] = (
            openai_client(gateway, env)
            .chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": f"mock-scenario:{sid}"}])
            .choices[0]
            .message.content
        )

    first = threading.Thread(target=hold_the_slot)
    first.start()
    try:
        assert mock.state.wait_for(lambda recs: any(r.scenario == sid for r in recs), timeout=20)
        client = openai_client(gateway, env).with_options(max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "again"}])
        assert caught.value.response.headers.get("retry-after") == "1"
        body = caught.value.response.json()["error"]
        assert body["code"] == "rate_limited" and body["reason_codes"] == ["capacity_exceeded"]
        other = openai_client(gateway, env, key=other_key)
        assert other.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]).choices
    finally:
        first.join(30)
    assert holder["reply"] == "late answer"
    # The slot is free again.
    assert (
        openai_client(gateway, env)
        .chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "after"}])
        .choices
    )
