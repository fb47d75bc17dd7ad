"""Large bodies are parsed and checked in worker processes (SPEC §5, issue 7 item 15), and
decide exactly as the loop does.

Two gateways share the mock provider and the secrets: one sends every body of 1 KiB or
more to its workers, the other decides everything on its loop. Every case must come out
the same on both, and the first must show (by its own metrics) that the workers did it.
A worker that cannot load the runtime a call is pinned to hands the call back to the loop;
a worker that dies fails its call closed and the next call gets a fresh pool.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.load import load_runtime
from gateway.errors import ServiceError
from gateway.keyring import rotate_keyring_file
from gateway.mockprovider import MockProviderServer
from gateway.obs.metrics import Metrics
from gateway.proxy import offload
from gateway.state import METRICS, RUNTIME
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, policy_text, raw_client

SECRET = "sk-offload-TEST-51c0ffee9a"
PAD = "lorem ipsum dolor sit amet " * 80  # 2 KiB of ordinary text

OFFLOADED = "[server]\ncheck_workers = 2\n[limits]\noffload_bytes = 1024\n"
IN_LOOP = "[server]\ncheck_workers = 0\n"


@pytest.fixture(scope="module")
def pair(gateways: GatewayFactory) -> Iterator[tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]]]:
    with (
        gateways("offloaded", secrets_=[SECRET], config_extra=OFFLOADED) as workers,
        gateways("inloop", secrets_=[SECRET], config_extra=IN_LOOP) as loop,
    ):
        assert _warm(workers[1])
        yield workers, loop


def _warm(gateway: GatewayThread) -> bool:
    """Have every worker load the gateway's runtime (as `wiregate serve` starts doing at once)."""
    assert gateway.running is not None
    app = gateway.running.app
    return bool(gateway.call(app[offload.OFFLOAD].warm(app[RUNTIME].current), timeout=120))


def _count(gateway: GatewayThread, stage: str, outcome: str) -> float:
    assert gateway.running is not None
    registry = gateway.running.app[METRICS].registry
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "wiregate_offloaded"
        for s in m.samples
        if s.name == "wiregate_offloaded_total" and s.labels == {"stage": stage, "outcome": outcome}
    )


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "messages": [{"role": "user", "content": text}], **extra}


REQUESTS: dict[str, bytes] = {
    "benign": json.dumps(_chat(PAD)).encode(),
    "benign_stream": json.dumps(_chat(PAD, stream=True)).encode(),
    "secret": json.dumps(_chat(f"{PAD} {SECRET} {PAD}")).encode(),
    "secret_base64": json.dumps(_chat(f"{PAD} {base64.b64encode(SECRET.encode()).decode()}")).encode(),
    "secret_in_tool_args": json.dumps(
        {
            "model": "gpt-4.1",
            "messages": [
                {"role": "user", "content": PAD},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": json.dumps({"k": SECRET})},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
        }
    ).encode(),
    "duplicate_keys": (
        '{"model": "gpt-4.1", "messages": [{"role": "user", "content": "' + PAD + '", "content": "' + SECRET + '"}]}'
    ).encode(),
    "malformed": b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "' + PAD.encode() + b'"',
    "too_deep": json.dumps(_chat(PAD, metadata=None)).replace("null", "[" * 80 + "]" * 80).encode(),
}


def _outcome(env: Env, gateway: GatewayThread, body: bytes) -> tuple[int, Any]:
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"},
    )
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            return 200, "[DONE]" in r.text and SECRET not in r.text
        return 200, r.json()["choices"][0]["message"]["role"]
    error = r.json()["error"]
    assert SECRET not in r.text
    return r.status_code, (error["code"], error.get("reason_codes"))


@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_requests_decide_the_same_in_a_worker(pair: Any, mock: MockProviderServer, case: str) -> None:
    (w_env, w_gw), (l_env, l_gw) = pair
    parsed_before = _count(w_gw, "parse", "done")
    since = mock.state.records()[-1].seq if mock.state.records() else 0
    in_worker = _outcome(w_env, w_gw, REQUESTS[case])
    on_loop = _outcome(l_env, l_gw, REQUESTS[case])
    assert in_worker == on_loop
    assert _count(w_gw, "parse", "done") == parsed_before + 1  # the worker parsed it
    if in_worker[0] == 200:
        assert _count(w_gw, "send", "done") >= 1
    for record in mock.state.records():
        if record.seq > since:
            assert SECRET.encode() not in record.body


RESPONSES: dict[str, dict[str, Any]] = {
    "benign": {"text": PAD},
    "secret": {"text": f"{PAD} {SECRET}"},
    "secret_split": {"text": f"{PAD} {SECRET} {PAD}", "chunk_size": 3},
    "secret_tool_args": {"tool_calls": [{"name": "f", "arguments": json.dumps({"pad": PAD, "k": SECRET})}]},
}


@pytest.mark.parametrize("case", sorted(RESPONSES))
@pytest.mark.parametrize("stream", [False, True])
def test_responses_decide_the_same_in_a_worker(pair: Any, mock: MockProviderServer, case: str, stream: bool) -> None:
    (w_env, w_gw), (l_env, l_gw) = pair
    read_before = _count(w_gw, "read", "done")
    results = []
    for env, gateway in ((w_env, w_gw), (l_env, l_gw)):
        sid = "o" + uuid.uuid4().hex[:12]
        mock.state.add_scenario(sid, [RESPONSES[case]])
        body = json.dumps(_chat(f"mock-scenario:{sid}", stream=stream)).encode()
        results.append(_outcome(env, gateway, body))
    assert results[0] == results[1]
    assert (results[0][0] == 200) == (case == "benign")
    assert _count(w_gw, "read", "done") == read_before + 1  # the response was read in a worker


def test_released_bytes_are_the_same(pair: Any, mock: MockProviderServer) -> None:
    """A benign large response reaches the client byte for byte whichever side read it."""
    (w_env, w_gw), (l_env, l_gw) = pair
    texts = []
    for env, gateway in ((w_env, w_gw), (l_env, l_gw)):
        sid = "b" + uuid.uuid4().hex[:12]
        mock.state.add_scenario(sid, [{"text": PAD + "fin", "chunk_size": 64}])
        r = raw_client(gateway, env).post(
            "/v1/chat/completions",
            json=_chat(f"mock-scenario:{sid}", stream=True),
            headers={"authorization": f"Bearer {env.gateway_key}"},
        )
        assert r.status_code == 200
        pieces = [
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in r.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        ]
        texts.append("".join(pieces))
    assert texts[0] == texts[1] == PAD + "fin"


def test_a_worker_never_decides_under_another_runtime(gateways: GatewayFactory, mock: MockProviderServer) -> None:
    """The configuration on disk changed and was not reloaded: a worker loading it would
    hold a runtime other than the one the call is pinned to, so the call is decided on the
    loop, under the pinned runtime; after the reload the workers take over again."""
    other = "sk-offload-OTHER-77aa00bb11"
    with gateways("offload-stale", secrets_=[SECRET], config_extra=OFFLOADED) as (env, gateway):
        env.write_secrets([SECRET, other])  # on disk only, before any worker started
        body_old = json.dumps(_chat(f"{PAD} {SECRET}")).encode()
        body_new = json.dumps(_chat(f"{PAD} {other}")).encode()
        assert not _warm(gateway), "no worker may hold the runtime on disk as the pinned one"
        assert _outcome(env, gateway, body_old)[0] == 403
        assert _outcome(env, gateway, body_new)[0] == 200  # the pinned policy does not know it yet
        assert _count(gateway, "parse", "cold") == 2  # the workers could not be warmed: on the loop
        assert _count(gateway, "parse", "done") == 0
        assert gateway.reload()
        assert _outcome(env, gateway, body_new)[0] == 403  # the call waits for the warm-up
        assert _count(gateway, "parse", "cold") == 3
        assert _count(gateway, "parse", "done") == 1


def test_runtime_key_names_everything_a_decision_depends_on(make_env: Any) -> None:
    env: Env = make_env(secrets_=[SECRET])
    first = offload.runtime_key(load_runtime(env.config))
    assert offload.runtime_key(load_runtime(env.config)) == first  # a fresh load of the same files
    env.write_secrets([SECRET, "sk-another-value-000111"])
    second = offload.runtime_key(load_runtime(env.config))
    assert second != first  # same policy version, new literal
    rotate_keyring_file(env.dir / "keys" / "bindings-keyring.json")
    assert offload.runtime_key(load_runtime(env.config)) != second  # new binding key
    (env.dir / "wiregate.toml").write_text((env.dir / "wiregate.toml").read_text() + "[limits]\njson_depth = 20\n")
    assert offload.runtime_key(load_runtime(env.config)) not in {first, second}


# --- the pool itself ------------------------------------------------------------------


def _die() -> None:
    os._exit(3)


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_lost_worker_fails_its_call_closed_and_the_pool_recovers(make_env: Any) -> None:
    env: Env = make_env()
    pool = offload.Offload(env.config, 1, Metrics())

    async def go() -> None:
        try:
            with pytest.raises(ServiceError) as caught:
                await pool._run("parse", _die)
            assert caught.value.status == 503
            assert await pool._run("parse", _nap, 0.0) == 0.0
        finally:
            await pool.close()

    asyncio.run(go())
    assert pool.metrics.offloaded.labels("parse", "failed")._value.get() == 1


def test_the_pool_runs_two_per_worker_queues_a_bounded_burst_and_refuses_past_it(make_env: Any) -> None:
    env: Env = make_env()
    pool = offload.Offload(env.config, 1, Metrics())
    queued = offload.QUEUED_PER_WORKER

    async def go() -> None:
        try:
            assert await pool._run("read", _nap, 0.0) == 0.0  # the pool is up
            running = [asyncio.ensure_future(pool._run("read", _nap, 1.0)) for _ in range(2)]
            await asyncio.sleep(0.05)  # both running: 2 × workers
            assert pool._in_flight == 2
            waiting = [asyncio.ensure_future(pool._run("read", _nap, 0.01 * (n + 1))) for n in range(queued)]
            await asyncio.sleep(0.05)
            assert pool._in_flight == 2 and pool._waiting == queued  # queued, not refused, not running
            with pytest.raises(ServiceError) as caught:  # past the queue: refused at once
                await pool._run("read", _nap, 0.0)
            assert caught.value.reason_codes == ("capacity_exceeded",)
            assert await asyncio.gather(*running) == [1.0, 1.0]
            assert await asyncio.gather(*waiting) == [0.01 * (n + 1) for n in range(queued)]
            # a queued caller that goes away leaves its place
            blockers = [asyncio.ensure_future(pool._run("read", _nap, 1.0)) for _ in range(2)]
            await asyncio.sleep(0.05)
            gone = asyncio.ensure_future(pool._run("read", _nap, 0.0))
            await asyncio.sleep(0.01)
            assert pool._waiting == 1
            gone.cancel()
            await asyncio.sleep(0)
            assert pool._waiting == 0
            await asyncio.gather(*blockers)
            assert pool._in_flight == 0 and await pool._run("read", _nap, 0.0) == 0.0
        finally:
            await pool.close()

    asyncio.run(go())
    assert pool.metrics.offloaded.labels("read", "busy")._value.get() == 1


def test_no_configuration_file_means_no_workers(tmp_path: Path) -> None:
    pool = offload.Offload(None, 4, Metrics())
    assert not pool.enabled


def test_the_worker_that_parses_a_body_also_splits_it_for_attribution(pair: Any) -> None:
    """With attribution collecting, the parse stage returns the split the loop would make
    (host labels applied), so the loop never parses an offloaded body again for it."""
    from gateway.carriers import CARRIERS
    from gateway.proxy import projections

    (_, workers), _ = pair
    assert workers.running is not None
    app = workers.running.app
    runtime = app[RUNTIME].current
    doc = {
        "model": "gpt-4.1",
        "messages": [{"role": "system", "content": PAD}, {"role": "user", "content": "What changed? " + PAD}],
    }
    raw = json.dumps(doc).encode()
    labels = {"/messages/0": "host.workspace_configuration"}
    pool = app[offload.OFFLOAD]
    summary = workers.call(pool.parse(runtime, "openai.chat", raw, labels), timeout=60)
    expected = projections.attribute(runtime, CARRIERS["openai.chat"], doc, labels)
    assert summary.attributed == expected
    assert [b.block_id for b in expected.split.blocks] == ["host.workspace_configuration", "prompt.current_user_turn"]
    assert workers.call(pool.parse(runtime, "openai.chat", raw), timeout=60).attributed is None  # not collecting


def test_a_worker_lost_while_idle_is_replaced_by_the_next_warm_up(make_env: Any) -> None:
    """A worker dies between calls; the warm-up for the next runtime (a reload's, or the
    next large call's) finds the pool broken: it starts a fresh one and warms it, rather
    than leave every large body to the loop until a restart."""
    env: Env = make_env()
    pool = offload.Offload(env.config, 1, Metrics())

    async def go() -> None:
        try:
            assert await pool.warm(await asyncio.to_thread(load_runtime, env.config))
            first = pool._pool
            assert first is not None
            for pid in list(first._processes):  # type: ignore[attr-defined]
                os.kill(pid, signal.SIGKILL)
            for _ in range(200):
                if first._broken:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.05)
            await asyncio.to_thread(env.write_policy, policy_text(version="after-the-loss"))
            assert await pool.warm(await asyncio.to_thread(load_runtime, env.config))
            assert pool._pool is not None and pool._pool is not first
            assert await pool._run("parse", _nap, 0.0) == 0.0
        finally:
            await pool.close()

    asyncio.run(go())


def _refuse_in_a_worker(kind: str) -> None:
    from gateway import errors

    raise getattr(errors, kind)(422, "invalid_request", ("invalid_request",), headers={"x-a": "b"}, retryable=True)


@pytest.mark.parametrize("kind", ["ClientError", "PolicyRefusal", "UpstreamError", "ServiceError"])
def test_a_refusal_raised_in_a_worker_comes_back_whole_and_the_pool_survives(kind: str) -> None:
    """A GatewayError crosses the process boundary intact: by default an exception is rebuilt
    from its message alone, which fails for ours, and an answer the pool cannot unpickle
    breaks the pool for every call in it."""
    import concurrent.futures
    import multiprocessing
    import pickle

    from gateway import errors

    again = pickle.loads(pickle.dumps(getattr(errors, kind)(413, "payload_too_large", ("payload_too_large",))))
    assert type(again) is getattr(errors, kind) and (again.status, again.reason_codes) == (413, ("payload_too_large",))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        with pytest.raises(getattr(errors, kind)) as info:
            pool.submit(_refuse_in_a_worker, kind).result(timeout=60)
        err = info.value
        assert (err.status, err.code, err.reason_codes, err.headers, err.retryable) == (
            422,
            "invalid_request",
            ("invalid_request",),
            {"x-a": "b"},
            True,
        )
        assert pool.submit(len, "still here").result(timeout=60) == 10
