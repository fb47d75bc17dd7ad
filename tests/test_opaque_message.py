"""Images and files are refused by default (`opaque_content`), and the refusal tells the
operator exactly how to allow them per profile — without repeating anything the request
held. Official SDKs as clients."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client

IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
PROMPT = "describe-this-picture-please-4417"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("opaque_message") as started:
        yield started


def _says_how_to_allow(message: str, profile: str) -> None:
    assert f'add "{profile}" to allow_opaque_profiles in policy.toml' in message
    assert "opaque_content" in message
    assert PROMPT not in message and IMAGE not in message and "data:" not in message


def test_openai_image_refusal_names_the_policy_setting(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPT},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                    ],
                }
            ],
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["reason_codes"] == ["opaque_content"]
    _says_how_to_allow(error["message"], "mock-openai")
    assert len(mock.state.records()) == before  # nothing was sent


def test_anthropic_document_refusal_names_the_policy_setting(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    with pytest.raises(anthropic.UnprocessableEntityError) as caught:
        anthropic_client(gateway, env).messages.create(
            model="claude-sonnet-4-6",
            max_tokens=16,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPT},
                        {
                            "type": "document",
                            "source": {"type": "base64", "media_type": "application/pdf", "data": IMAGE},
                        },
                    ],
                }
            ],
        )
    body = caught.value.body
    assert isinstance(body, dict)
    _says_how_to_allow(body["error"]["message"], "mock-anthropic")


def test_allowed_profile_passes_the_image(gateways: GatewayFactory) -> None:
    """Doing what the message says lets the image through to that profile."""
    with gateways("opaque_allowed", policy_extra='allow_opaque_profiles = ["mock-openai"]\n') as (env, gateway):
        reply = openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}}],
                }
            ],
        )
        assert reply.choices[0].message.content
