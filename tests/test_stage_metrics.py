"""Per-stage latency histograms (issue 11): one call through the proxy observes every stage
of the wire path once, under a bounded label set."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, openai_client, raw_client

STAGES = ("read", "parse", "plan", "check_before_send", "upstream", "buffer", "check_before_release", "release")


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("stage-metrics") as started:
        yield started


def _counts(env: Env, gateway: GatewayThread) -> dict[str, float]:
    text = raw_client(gateway, env).get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^wiregate_stage_seconds_count\{stage="([a-z_]+)"\} (\S+)$', text, re.M)
    }


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_observes_every_stage_once(gw: tuple[Env, GatewayThread], stream: bool) -> None:
    env, gateway = gw
    before = _counts(env, gateway)
    client = openai_client(gateway, env)
    messages = [{"role": "user", "content": "hello"}]
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="gpt-4.1", messages=messages, stream=True) if c.choices)  # fmt: skip
    else:
        assert client.chat.completions.create(model="gpt-4.1", messages=messages).choices[0].message.content
    after = _counts(env, gateway)
    for stage in STAGES:
        assert after.get(stage, 0) - before.get(stage, 0) == 1, stage
    assert set(after) <= {*STAGES, "checks"}, "a bounded label set"


def test_labelled_children_are_remembered_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Labelled` hands out prometheus_client's own children (counts land in the registry as
    before), looks each label set up once, and keeps at most MAX_KEPT_CHILDREN of them."""
    from prometheus_client import generate_latest

    from gateway.obs import metrics as metrics_module

    m = metrics_module.Metrics()
    first = m.requests.labels("openai.chat", "openai.chat", "p", "released")
    first.inc()
    again = m.requests.labels("openai.chat", "openai.chat", "p", "released")
    assert again is first
    again.inc(2)
    assert first is m.requests.metric.labels("openai.chat", "openai.chat", "p", "released")
    text = generate_latest(m.registry).decode()
    assert (
        'wiregate_requests_total{carrier="openai.chat",outcome="released",profile="p",route="openai.chat"} 3.0' in text
    )

    monkeypatch.setattr(metrics_module, "MAX_KEPT_CHILDREN", 2)
    bounded = metrics_module.Labelled(m.reloads.metric)
    for outcome in ("ok", "failed", "other"):
        bounded.labels(outcome).inc()
    assert len(bounded._children) == 2
    assert bounded.labels("other") is m.reloads.metric.labels("other")  # still the registry's child, just not kept
    assert 'wiregate_config_reloads_total{outcome="other"} 1.0' in generate_latest(m.registry).decode()
