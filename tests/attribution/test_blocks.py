"""Requests split into registered blocks, per carrier; host labels; the registry's rules."""

from __future__ import annotations

import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.attribution import blocks, registry
from gateway.attribution.blocks import estimate, parse_labels, split
from gateway.carriers import CARRIERS
from gateway.context import builder

REG = registry.build()
PREPARED = builder.TRUST_POLICY + "\n\n" + builder.BEGIN_MARKER + '\n{"items":[]}\n' + builder.END_MARKER


def digest(block_id: str, data: bytes) -> str:
    return "d" + str(len(data))  # tests only: the gateway uses a keyed digest


def ids(carrier: str, doc: dict, labels: dict | None = None) -> list[tuple[str, int]]:
    layout = CARRIERS[carrier].prompt_layout(doc)
    return [(x.block_id, x.estimate) for x in split(layout, REG, digest, labels).blocks]


def test_the_wrapper_constants_are_the_builders() -> None:
    assert blocks.BEGIN_MARKER == builder.BEGIN_MARKER and blocks.END_MARKER == builder.END_MARKER
    assert blocks.TRUST_HEAD == builder.TRUST_POLICY + "\n\n"


def test_estimate_is_ceil_runes_over_four() -> None:
    assert [estimate(t) for t in ("", "a", "abcd", "abcde", "ééééé", "😀" * 8)] == [0, 1, 1, 2, 2, 2]


def test_openai_chat_split() -> None:
    doc = {
        "model": "gpt-4.1",
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first " + PREPARED + " tail"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "file body"},
            {"role": "tool", "tool_call_id": "c2", "content": "more"},
            {"role": "user", "content": "now this"},
        ],
    }
    got = [i for i, _ in ids("openai.chat", doc)]
    assert got == [
        "prompt.tool_schemas",
        "prompt.system_instructions",
        "prompt.history.user_turn",
        "wiregate.prepared_context",
        "prompt.history.user_turn",
        "prompt.history.assistant_turn",
        "prompt.tool_result",  # each tool message is one block, fields and all
        "prompt.tool_result",
        "prompt.current_user_turn",
    ]
    est = dict(ids("openai.chat", doc))
    assert est["wiregate.prepared_context"] == estimate(PREPARED)
    assert est["prompt.current_user_turn"] == estimate("now this")


def test_anthropic_messages_split() -> None:
    doc = {
        "model": "claude-sonnet-4-5",
        "system": [{"type": "text", "text": "Rules."}],
        "tools": [{"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "a", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "out"},
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
    }
    got = [i for i, _ in ids("anthropic.messages", doc)]
    assert got == [
        "prompt.tool_schemas",  # both tools: one block
        "prompt.system_instructions",
        "prompt.history.user_turn",
        "prompt.history.assistant_turn",
        "prompt.tool_result",
        "prompt.current_user_turn",
    ]


def test_openai_responses_split_and_continuation() -> None:
    doc = {
        "model": "gpt-4.1",
        "instructions": "Be exact.",
        "previous_response_id": "resp_1",
        "input": [
            {"type": "function_call_output", "call_id": "c", "output": "42"},
            {"role": "user", "content": "and?"},
        ],
    }
    assert [i for i, _ in ids("openai.responses", doc)] == [
        "prompt.system_instructions",
        "prompt.tool_result",
        "prompt.current_user_turn",
    ]
    assert blocks.continues_server_state(doc) and not blocks.continues_server_state({"input": "x"})


def test_host_labels_map_pointers_to_registered_ids() -> None:
    doc = {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": "Repo rules"},
            {"role": "system", "content": "secret/path/AGENTS.md"},
            {"role": "user", "content": "q"},
        ],
    }
    labels, invalid = parse_labels(
        json.dumps({"/messages/0": "host.workspace_configuration", "/messages/1/content": "src/AGENTS.md"})
    )
    assert not invalid
    assert [i for i, _ in ids("openai.chat", doc, labels)] == [
        "host.workspace_configuration",
        "unattributed.prompt_surface",  # path-like or unknown: never an opportunity
        "prompt.current_user_turn",
    ]
    assert parse_labels("not json") == ({}, True)
    assert parse_labels("x" * 9000) == ({}, True)
    assert parse_labels('{"a": "b"}') == ({}, True)  # not a pointer


def test_nothing_of_the_request_is_kept() -> None:
    doc = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "the-secret-words"}]}
    layout = CARRIERS["openai.chat"].prompt_layout(doc)
    (only,) = split(layout, REG, lambda b, t: "h:0123").blocks
    assert "secret" not in repr(only)


def test_past_the_per_call_bound_the_rest_is_one_unattributed_block() -> None:
    doc = {"model": "gpt-4.1", "messages": [{"role": "tool", "content": str(n)} for n in range(10)]}
    got = split(CARRIERS["openai.chat"].prompt_layout(doc), REG, digest, max_blocks=4)
    assert got.truncated and len(got.blocks) == 4 and got.blocks[-1].block_id == "unattributed.prompt_surface"


@pytest.mark.parametrize(
    ("origin", "control"),
    [
        ("host_policy", "assembly"),
        ("workspace_configuration", "direct"),
        ("user_task_payload", "direct"),
        ("unknown", "none"),
    ],
)
def test_illegal_pairs_are_refused(origin: str, control: str) -> None:
    entry = {
        "id": "host.thing",
        "display_name": "x",
        "type": "instruction",
        "origin": origin,
        "control": control,
        "lifetime": "unknown",
        "action": "a",
        "validation": "v",
    }
    with pytest.raises(registry.RegistryError):
        registry.build([entry])


@pytest.mark.parametrize(
    "bad", ["Host.x", "host", "host.rules.md", "a/b.c", "prompt.system_instructions", "unattributed.prompt_surface"]
)
def test_unregistrable_ids_are_refused(bad: str) -> None:
    entry = {
        "id": bad,
        "display_name": "x",
        "type": "notice",
        "origin": "host_policy",
        "control": "direct",
        "lifetime": "boundary_only",
        "action": "a",
        "validation": "v",
    }
    with pytest.raises(registry.RegistryError):
        registry.build([entry])


def test_every_builtin_pair_is_legal_and_no_mixed_block_is_direct() -> None:
    for spec in REG:
        assert spec.control in registry.LEGAL[spec.origin]
    # prepared context and tool results mix framing with payload: never `direct`
    assert REG.resolve("wiregate.prepared_context").control == "assembly"
    assert REG.resolve("prompt.tool_result").control == "assembly"
    assert REG.resolve("anything.else").id == "unattributed.prompt_surface"


def test_the_configuration_extends_the_registry_and_refuses_illegal_entries() -> None:
    from pydantic import ValidationError

    from gateway.config.model import GatewayConfig
    from gateway.proxy.projections import registry_for

    entry = {
        "id": "host.coding_rules",
        "display_name": "Coding rules",
        "type": "instruction",
        "origin": "host_policy",
        "control": "direct",
        "lifetime": "session_persistent",
        "action": "Trim",
        "validation": "Evals",
        "target": 100,
    }
    config = GatewayConfig(deployment_id="d", attribution={"blocks": [entry]})
    reg = registry_for(config.attribution)
    assert reg.resolve("host.coding_rules").target == 100
    with pytest.raises(ValidationError):
        GatewayConfig(deployment_id="d", attribution={"blocks": [{**entry, "control": "assembly"}]})
    with pytest.raises(ValidationError):
        GatewayConfig(deployment_id="d", attribution={"retention_days": 8})


def _documented_identity(key: bytes, block_id: str, text: str) -> str:
    """The construction as the README states it, written out independently: XXH3-128 of the
    text's UTF-8, seeded with the first 8 bytes (little-endian) of an HMAC of the key, then
    the id, its length (u32) and the text's length (u64), little-endian, through keyed
    BLAKE3 under another HMAC of the key; 8 bytes, hex, after "x3b:"."""
    from blake3 import blake3
    from xxhash import xxh3_128

    derived = hmac.digest(key, b"wiregate attribution block identity v3", "sha256")
    seed = int.from_bytes(hmac.digest(key, b"wiregate attribution block fingerprint seed v3", "sha256")[:8], "little")
    data, name = text.encode("utf-8", "surrogatepass"), block_id.encode()
    fingerprint = xxh3_128(data, seed=seed).digest()
    message = fingerprint + name + len(name).to_bytes(4, "little") + len(data).to_bytes(8, "little")
    return "x3b:" + blake3(message, key=derived).digest(8).hex()


def _identity(key: bytes, block_id: str, text: str) -> str:
    """A text's identity as a collected call makes it: one system part, split with the keyed digest."""
    from gateway.carriers.base import PromptLayout, PromptPart
    from gateway.proxy.projections import block_digest

    part = PromptPart(("system",), "system", None, None, "text", text, True)
    (block,) = split(PromptLayout((part,)), REG, block_digest(key), {"/system": block_id}).blocks
    return block.instance


def test_block_identities_are_keyed_stable_and_name_their_construction() -> None:
    from blake3 import blake3
    from xxhash import xxh3_128

    key = b"k" * 32
    block, text = "prompt.system_instructions", "You are a careful assistant. " * 50
    made = _identity(key, block, text)
    assert made == _identity(key, block, text) and made.startswith("x3b:") and len(made) == 4 + 16
    assert made == _documented_identity(key, block, text)
    assert (
        _identity(b"j" * 32, block, text) != made
    )  # another key, another identity: nobody can test guesses without it
    assert _identity(key, block, text + " ") != made
    assert _identity(key, "prompt.history.user_turn", text) != made  # the block id is part of the identity
    # Neither the unkeyed nor the unseeded construction: both the seed and the PRF key come from the key.
    data = text.encode()
    trailer = block.encode() + len(block).to_bytes(4, "little") + len(data).to_bytes(8, "little")
    unseeded = xxh3_128(data).digest() + trailer
    derived = hmac.digest(key, b"wiregate attribution block identity v3", "sha256")
    assert made[4:] != blake3(unseeded, key=derived).digest(8).hex()
    seed = int.from_bytes(hmac.digest(key, b"wiregate attribution block fingerprint seed v3", "sha256")[:8], "little")
    assert made[4:] != blake3(xxh3_128(data, seed=seed).digest() + trailer).digest(8).hex()
    lone = _identity(key, block, "\ud800 lone surrogate")  # any str the reader keeps
    assert lone == _identity(key, block, "\ud800 lone surrogate") != _identity(key, block, "\ud801 lone surrogate")
    # Texts that differ only far in, or in trailing NULs, are other identities.
    long = "x" * 70_000
    variants = (long, long + "\x00", long[:-1] + "y", long[:-1])
    assert len({_identity(key, block, v) for v in variants}) == 4


def test_a_block_of_several_parts_hashes_their_joined_text() -> None:
    """Consecutive parts of one block are one identity and one estimate, of the joined text
    (a lone surrogate at a part's end and one at the next part's start included)."""
    from gateway.proxy.projections import block_digest

    key = b"k" * 32
    doc = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": t} for t in ("é" * 5 + "\ud83d", "\ude00x")]}
        ],
    }
    (only,) = split(CARRIERS["openai.chat"].prompt_layout(doc), REG, block_digest(key)).blocks
    joined = "é" * 5 + "\ud83d" + "\ude00x"
    assert only.instance == _documented_identity(key, only.block_id, joined)
    assert only.estimate == estimate(joined) == 2


_TEXTS = st.text(st.characters(codec="utf-8") | st.characters(categories=["Cs"]), max_size=64) | st.builds(
    lambda unit, n: unit * n, st.text(min_size=1, max_size=3), st.integers(0, 12_000)
)


@given(
    text=_TEXTS.filter(bool),
    name=st.sampled_from(["prompt.tool_result", "wiregate.prepared_context", "prompt.system_instructions"]),
)
@settings(max_examples=200, deadline=None)
def test_block_identities_follow_the_documented_construction(text: str, name: str) -> None:
    """Any text the reader keeps (ASCII and not, lone surrogates, up to 36 KB) and any id."""
    assert _identity(b"k" * 32, name, text) == _documented_identity(b"k" * 32, name, text)


def test_remembered_scope_and_session_digests_are_the_log_digests() -> None:
    from gateway.obs.logging import digest as log_digest
    from gateway.proxy import projections

    key = b"k" * 32
    for value in ("scope\x00default", "session\x00" + "s" * projections.KEPT_DIGEST_CHARS, "session\x00" + "x" * 5000):
        assert projections._kept_digest(key, value) == log_digest(value, key)  # noqa: SLF001
        assert projections._kept_digest(key, value) == log_digest(value, key)  # noqa: SLF001 -- remembered or not
    assert projections._kept_digest(b"j" * 32, "scope\x00default") != projections._kept_digest(key, "scope\x00default")  # noqa: SLF001


def test_prepared_context_is_cut_out_of_non_ascii_text_and_hashed_as_its_own_text() -> None:
    """The marker scan reads each part's UTF-8: a marker beside non-ASCII text and a lone
    surrogate is found, and each piece's identity is its own text's."""
    from gateway.proxy.projections import block_digest

    key = b"k" * 32
    head, tail = "préface \ud800 ", " — fin"
    doc = {"model": "m", "messages": [{"role": "user", "content": head + PREPARED + tail}]}
    got = split(CARRIERS["openai.chat"].prompt_layout(doc), REG, block_digest(key)).blocks
    assert [(b.block_id, b.estimate) for b in got] == [
        ("prompt.current_user_turn", estimate(head)),
        ("wiregate.prepared_context", estimate(PREPARED)),
        ("prompt.current_user_turn", estimate(tail)),
    ]
    assert got[1].instance == _documented_identity(key, "wiregate.prepared_context", PREPARED)
    assert got[0].instance == _documented_identity(key, "prompt.current_user_turn", head)
