"""`make demo`: the gateway and the bundled mock provider, an allowed call, a blocked call
and a cached second turn — on loopback, in one process, in a throwaway directory.

The configuration is exactly what `wiregate init` writes (the gateway serves the mock
provider itself), on free ports so that a running `make run` is not disturbed."""

from __future__ import annotations

import asyncio
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from gateway import devsetup
from gateway.devmock import MOCK_PROVIDER
from gateway.obs import logging as log
from gateway.server import start

SECRET = "sk-demo-PLEASE-never-leak-0042"
POLICY = "You are the demo assistant. Follow the house rules carefully. " * 90  # > 1024 tokens


async def _call(
    session: aiohttp.ClientSession, url: str, key: str, ctx: ssl.SSLContext, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body, headers={"authorization": f"Bearer {key}"}, ssl=ctx) as r:
        return r.status, await r.json()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _demo(work: Path) -> None:
    facts = devsetup.init(work, https_port=0, mock_port=_free_port())
    (work / "secrets" / "secret-values.txt").write_text(SECRET + "\n")
    running = await start(work / "wiregate.toml")
    mock = running.app[MOCK_PROVIDER]
    try:
        base = f"https://127.0.0.1:{running.https_port}"
        ctx = ssl.create_default_context(cafile=facts["ca"])
        key = facts["gateway_key"]
        async with aiohttp.ClientSession() as session:
            status, body = await _call(
                session,
                base + "/v1/chat/completions",
                key,
                ctx,
                {"model": "mock-gpt-1", "messages": [{"role": "user", "content": "Say hello."}]},
            )
            print(f"1. allowed: HTTP {status}: {body['choices'][0]['message']['content']!r}")
            status, body = await _call(
                session,
                base + "/v1/chat/completions",
                key,
                ctx,
                {"model": "mock-gpt-1", "messages": [{"role": "user", "content": f"My key is {SECRET}"}]},
            )
            sent = len(mock.state.records())
            print(
                f"2. blocked: HTTP {status}: code={body['error']['code']} reason_codes={body['error']['reason_codes']}"
                f" (requests the mock provider received so far: {sent}, the allowed one only)"
            )
            messages = [{"role": "user", "content": "What are the house rules?"}]
            for turn in (1, 2):
                status, body = await _call(
                    session,
                    base + "/v1/messages",
                    key,
                    ctx,
                    {"model": "mock-claude-1", "max_tokens": 64, "system": POLICY, "messages": messages},
                )
                u = body["usage"]
                print(
                    f"3.{turn} anthropic turn {turn}: HTTP {status}: cache write {u['cache_creation_input_tokens']}, "
                    f"cache read {u['cache_read_input_tokens']}, uncached input {u['input_tokens']}"
                )
                messages = [
                    *messages,
                    {"role": "assistant", "content": body["content"][0]["text"]},
                    {"role": "user", "content": "And then?"},
                ]
    finally:
        await running.stop()


def main() -> None:
    log.configure("warning")
    with tempfile.TemporaryDirectory(prefix="wiregate-demo-") as tmp:
        asyncio.run(_demo(Path(tmp) / "work"))


if __name__ == "__main__":
    main()
