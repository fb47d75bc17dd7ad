"""Base64 wrapped in lines (MIME's 76 columns, PEM's 64, `base64` without `-w 0`), sent
through a real gateway: each line is a run of its own, so a value whose encoding crossed a
line break, or sat in a last line shorter than a run worth decoding, was sent (and released:
an outside review read it back with `base64.b64decode`). The lines of such a block are now
also read joined, in requests and responses; prose and code with long words at line ends
still go through."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.inspection import decoders
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json, raw_client

SECRET = "zq7Vw9xKp2LmN4rT"
GW = tuple[Env, GatewayThread]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[GW]:
    with gateways("evasion-wrapped", secrets_=[SECRET]) as started:
        yield started


def _wrapped(prefix: str, width: int = 76, crlf: bool = False, suffix: str = "") -> str:
    """`prefix`, the value and `suffix`, base64 wrapped at `width` columns."""
    flat = base64.b64encode((prefix + SECRET + suffix).encode()).decode()
    lines = [flat[i : i + width] for i in range(0, len(flat), width)]
    return ("\r\n" if crlf else "\n").join(lines) + "\n"


CASES = {
    "MIME, the value's end in a short last line": _wrapped("Attachment follows; the deploy token for stage "),
    "MIME, the value across a break": _wrapped("Attachment follows; the token for the stage is: ", suffix=" and so on"),
    "PEM width, CRLF": _wrapped("A deploy token in a PEM-wide block ", width=64, crlf=True),
    "narrow lines": _wrapped("abcdefgh", width=16),
}


def test_each_case_hides_the_value_from_the_lines_read_alone() -> None:
    """The control: no line of any case decodes to the value on its own."""
    for text in CASES.values():
        for line in text.split():
            assert all(SECRET.encode() not in d for _, d in decoders.run_decodings(line.encode()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrapped_base64_in_a_request_is_refused(gw: GW, mock: MockProviderServer, case: str) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "attachment:\n" + CASES[case]}]}
    r = raw_client(gateway, env, uds=True).post(
        "/v1/chat/completions",
        content=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"},
    )
    assert r.status_code == 403 and "secret_value" in r.text, r.text
    assert len(mock.state.records()) == before  # nothing reached the provider


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrapped_base64_in_an_answer_is_withheld(gw: GW, mock: MockProviderServer, case: str) -> None:
    env, gateway = gw
    sid = "wr" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"text": "here it is:\n" + CASES[case]}])
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    r = post_json(gateway, env, "/v1/chat/completions", body)
    assert r.status_code == 403 and "secret_value" in r.text, r.text
    assert CASES[case].split()[1] not in r.text


def test_prose_and_code_with_long_words_at_line_ends_pass(gw: GW, mock: MockProviderServer) -> None:
    env, gateway = gw
    text = (
        "def computeTheAnswerQuickly(value):\n    returnValueUnchangedForNow = value\n"
        "The configuration key is namedSomethingRatherLong\nand continues here.\n"
        + base64.encodebytes(b"an ordinary attachment, nothing secret in it at all " * 3).decode()
    )
    body: dict[str, Any] = {"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}
    r = post_json(gateway, env, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text


def test_wrapped_blocks_join_lines_and_stop_at_a_partial_line() -> None:
    flat = base64.b64encode(b"0123456789" * 12).decode()
    text = f"x {flat[:76]}\n{flat[76:]}\nnext line here\n".encode()
    blocks = decoders.wrapped_blocks(text)
    # a full last line may take the next line's first word: more read, never less
    assert blocks == [(2, flat.encode() + b"next")]
    # a line shorter than 16 characters or not a whole number of groups ends the block
    assert decoders.wrapped_blocks(b"ABCDEFGHIJKLMNOPQ\nRSTU") == [(0, b"ABCDEFGHIJKLMNOPQRSTU")]
    assert decoders.wrapped_blocks(b"ABCDEFGHIJKLMNOP\nQRSTUVW\nXYZ") == [(0, b"ABCDEFGHIJKLMNOPQRSTUVW")]
