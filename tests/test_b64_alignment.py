"""Base64 inside a longer run of the base64 alphabet: a value encoded after k alphabet
characters (a URL path `…org/d/<base64>`, `id-<base64>`, `abc<base64>`) is decoded from
alignment k % 4, where it reads whole, and a run that mixes the standard (`+`, `/`) and URL
(`-`, `_`) alphabets is decoded too (`-` and `_` read as `+` and `/`), so standard base64
behind a `-` or `_` (and base64url behind a `/`) reads whole. Unit tests on
`decoders.run_decodings` with either finder, the engine's decisions, the real gateway for a
request and a response, the decoding budget, and the native finder against the reference."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection import decoders
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Engine, Subject
from gateway.inspection.formats import build_format_set
from gateway.mockprovider import MockProviderServer
from tests import native_build
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json, raw_client

SECRET = "plain-literal-0123456789"
# standard base64 holding both '+' and '/' (base64url: '-' and '_')
SECRET_STD = "wg~>?secret-value?>~"
AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"
# the shortest value whose encoding alone is decoded (8 bytes, the default shortest configured
# value: MIN_B64_RUN characters unpadded): found behind any prefix too
SHORTEST = "8bytes!?"
AWS_REASON = "secret_format:aws-access-key-id"

needs_native = native_build.needs(decoders.NATIVE_AVAILABLE, "native finder")
FINDERS = [pytest.param(True, id="native", marks=needs_native), pytest.param(False, id="reference")]


@pytest.fixture(autouse=True)
def _restore_native() -> Iterator[None]:
    yield
    decoders.use_native(True)


def _std(value: str) -> bytes:
    return base64.b64encode(value.encode())


def _url(value: str) -> bytes:
    return base64.urlsafe_b64encode(value.encode())


def _copies(data: bytes) -> list[bytes]:
    return [d for _, d in decoders.run_decodings(data)]


def test_the_values_encode_as_the_cases_need() -> None:
    assert b"+" in _std(SECRET_STD) and b"/" in _std(SECRET_STD)
    assert b"-" in _url(SECRET_STD) and b"_" in _url(SECRET_STD)
    assert b"+" not in _std(SECRET) and b"/" not in _std(SECRET)


# --- run_decodings ---------------------------------------------------------------------

PREFIX_ALPHABETS = {
    "letters": b"abcdefg",
    "capitals": b"IDXYZQR",
    "digits": b"0123456",
    "path": b"org/d/x",
    "url-chars": b"id-_ref",
}


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("alphabet", sorted(PREFIX_ALPHABETS))
@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("value", [SECRET, SECRET_STD, AWS_KEY, SHORTEST])
def test_value_reads_whole_after_any_prefix(native: bool, alphabet: str, k: int, value: str) -> None:
    """Every prefix length 0-7, of every class of alphabet characters (a `/` or a `-`
    before the other alphabet's base64 included), either encoding, padded or not: some copy
    holds the value, one of them starts k % 4 into the run (where the value's groups start),
    and every copy starts inside the run (so inside the unit it came from)."""
    decoders.use_native(native)
    prefix = PREFIX_ALPHABETS[alphabet][:k]
    for encode in (_std, _url):
        for encoded in (encode(value), encode(value).rstrip(b"=")):
            data = b"see " + prefix + encoded + b" here"
            runs = decoders.run_decodings(data)
            holding = [offset for offset, copy in runs if value.encode() in copy]
            assert holding, (prefix, encoded)
            assert 4 + k % 4 in holding
            assert all(4 <= offset < 4 + len(prefix + encoded) for offset, _ in runs)


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", [b"-", b"_", b"x-", b"id-", b"ref_", b"id-_x-", b"a-b_c-d", b"-_-_-_-_"])
def test_url_characters_before_standard_base64(native: bool, prefix: bytes) -> None:
    """A run mixing the alphabets (once dropped whole): the standard part reads whole."""
    decoders.use_native(native)
    assert any(SECRET_STD.encode() in c for c in _copies(b"[" + prefix + _std(SECRET_STD) + b"]"))


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", [b"/", b"+", b"d/", b"a+b", b"org/d/", b"x/y+z/"])
def test_standard_characters_before_base64url(native: bool, prefix: bytes) -> None:
    decoders.use_native(native)
    assert any(SECRET_STD.encode() in c for c in _copies(b"[" + prefix + _url(SECRET_STD).rstrip(b"=") + b"]"))


@pytest.mark.parametrize("native", FINDERS)
def test_copies_from_the_first_character_come_first_in_run_order(native: bool) -> None:
    """The copies from each run's first character (and its hex runs) keep their order, as
    before; the copies from the second, third and fourth characters follow, each alignment
    in run order (values split across runs encoded on their own are read by joining
    neighbouring copies)."""
    decoders.use_native(native)
    first, second = _std("first half of it"), _std("second half here")
    data = b"a " + first + b" b " + second + b" " + b"0123456789abcdef0123" + b" " + b"fedcba9876543210f"
    s1, s2 = 2, 2 + len(first) + 3
    s3 = s2 + len(second) + 1
    s4 = s3 + 21
    offsets = [offset for offset, _ in decoders.run_decodings(data)]
    # every hex run of more than 16 digits is read again from its second digit once all
    # runs are read from their first (hex parts split apart stay neighbours)
    assert offsets == [s1, s2, s3, s4, s3 + 1, s4 + 1, s1 + 1, s2 + 1, s1 + 2, s2 + 2, s1 + 3, s2 + 3]
    runs = decoders.run_decodings(data)
    assert runs[:6] == [
        (s1, b"first half of it"),
        (s2, b"second half here"),
        (s3, bytes.fromhex("0123456789abcdef0123")),
        (s4, bytes.fromhex("fedcba9876543210")),
        (s3 + 1, bytes.fromhex("123456789abcdef012")),
        (s4 + 1, bytes.fromhex("edcba9876543210f")),
    ]


@pytest.mark.parametrize("native", FINDERS)
def test_one_case_and_short_runs_stay_undecoded(native: bool) -> None:
    decoders.use_native(native)
    assert decoders.run_decodings(b"short words only 0123abcd") == []
    assert decoders.run_decodings(b"onelowercaseidentifierhere ONEUPPERCASEIDENTIFIER") == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(b"GZgz+/-_"), min_size=12, max_size=400).map(bytes))
def test_copies_are_bounded_by_three_times_the_run(run: bytes) -> None:
    """Up to four copies of a run (no hex digit in it: no hex copy), one from each of its
    first four characters that leaves `MIN_B64_RUN` characters or more, each three quarters
    of what is left: at most three times the run together."""
    one_case = run.islower() or run.isupper()
    expected = [] if one_case else [skip for skip in range(4) if len(run) - skip >= decoders.MIN_B64_RUN]
    for native in (True, False) if decoders.NATIVE_AVAILABLE else (False,):
        decoders.use_native(native)
        runs = decoders.run_decodings(run)
        assert [offset for offset, _ in runs] == expected
        assert sum(len(d) for _, d in runs) <= 3 * len(run)


# --- the engine ------------------------------------------------------------------------

URL_PREFIXES = [
    "https://files.example.org/d/",
    "https://cdn.example.com/x/",
    "https://example.net/files/v1/",
    "https://s.example.io/dl/",
]
ID_PREFIXES = ["id-", "ref_", "secret-", "abc", "session/", "tok", "k"]


def _engine(decode_budget: float | None = None) -> Engine:
    """The engine, at its default decode budget unless one is given."""
    engine = build_engine(
        secret_values=[SECRET, SECRET_STD],
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
        policy_version="t",
    )
    if decode_budget is not None:
        engine.decode_budget = decode_budget
    return engine


ENGINE = _engine()


def _subject(text: str) -> Subject:
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
    return Subject(raw=raw, units=parsed.units)


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", URL_PREFIXES + ID_PREFIXES)
@pytest.mark.parametrize(
    ("value", "reason"), [(SECRET, "secret_value"), (SECRET_STD, "secret_value"), (AWS_KEY, AWS_REASON)]
)
def test_encoded_value_behind_a_prefix_is_refused(native: bool, prefix: str, value: str, reason: str) -> None:
    decoders.use_native(native)
    for encoded in (_std(value), _url(value).rstrip(b"=")):
        verdict = ENGINE.inspect(_subject(f"download {prefix}{encoded.decode()} please"))
        assert not verdict.allowed, (prefix, encoded)
        assert reason in verdict.reason_codes


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", ["-", "id-", "x_y-", "ref_"])
def test_standard_base64_with_plus_and_slash_behind_url_characters_is_refused(native: bool, prefix: str) -> None:
    decoders.use_native(native)
    verdict = ENGINE.inspect(_subject(f"token {prefix}{_std(SECRET_STD).decode()} end"))
    assert not verdict.allowed and "secret_value" in verdict.reason_codes


@pytest.mark.parametrize("native", FINDERS)
def test_a_value_split_in_halves_each_encoded_behind_a_prefix_is_refused(native: bool) -> None:
    """The misaligned copies of neighbouring runs are neighbours too."""
    decoders.use_native(native)
    head, tail = _std(SECRET[:12]).decode(), _std(SECRET[12:]).decode()
    assert ENGINE.inspect(_subject(f"parts x{head} and y{tail} end")).reason_codes == ("secret_value",)


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", URL_PREFIXES + ID_PREFIXES)
def test_harmless_base64_behind_the_same_prefixes_is_allowed(native: bool, prefix: str) -> None:
    decoders.use_native(native)
    for value in ("an ordinary file name.pdf", "report-2024-final-v2", '{"page": 3, "size": 50}'):
        for encoded in (_std(value), _url(value).rstrip(b"=")):
            verdict = ENGINE.inspect(_subject(f"download {prefix}{encoded.decode()} please"))
            assert verdict.allowed, (prefix, value, verdict.reason_codes)


def test_misaligned_copies_count_against_the_budget() -> None:
    """Many encoded runs behind prefixes: allowed within the default budget; past a budget
    the copies from the first character alone would fit, withheld (never cut short)."""
    text = " ".join("id-" + _std(f"harmless-{i:06d}").decode() for i in range(6000))
    assert ENGINE.inspect(_subject(text)).allowed
    verdict = _engine(decode_budget=1.0).inspect(_subject(text))
    assert not verdict.allowed and "decode_limit" in verdict.reason_codes
    # a value past the point the budget runs out is not let through either
    verdict = _engine(decode_budget=1.0).inspect(_subject(text + " id-" + _std(SECRET).decode()))
    assert not verdict.allowed and "decode_limit" in verdict.reason_codes


@pytest.mark.parametrize("native", FINDERS)
def test_base64_of_base64_of_text_stays_within_the_default_budget(native: bool) -> None:
    """Both levels decode at every alignment: 200 KB of text encoded twice is read, not
    withheld, and a value inside it is still found."""
    decoders.use_native(native)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = (text * (1 + 200_000 // len(text)))[:200_000]
    twice = base64.b64encode(base64.b64encode(text.encode())).decode()
    assert ENGINE.inspect(_subject(twice)).allowed
    hidden = base64.b64encode(base64.b64encode((text + " " + SECRET).encode())).decode()
    assert ENGINE.inspect(_subject(hidden)).reason_codes == ("secret_value",)


@pytest.mark.parametrize("native", FINDERS)
def test_a_long_hex_run_of_digit_text_stays_within_the_default_budget(native: bool) -> None:
    """Hex of digit text is itself a base64 run (no letters), and hex again once decoded,
    each hex run read from two digits: about six and a quarter times its length in all,
    read, not withheld; a value hex-encoded after it is still found."""
    decoders.use_native(native)
    run = "3031323334353637" * 20_000
    assert ENGINE.inspect(_subject(run)).allowed
    assert ENGINE.inspect(_subject(run + "0" + SECRET.encode().hex())).reason_codes == ("secret_value",)


@pytest.mark.parametrize("native", FINDERS)
@pytest.mark.parametrize("prefix", ["a", "abc", "deadbeef1", "0", "f00"])
def test_hex_behind_an_odd_number_of_hex_digits_is_refused(native: bool, prefix: str) -> None:
    """A hex run is read from its first digit and from its second: whatever the prefix's
    parity, one of the two reads the value."""
    decoders.use_native(native)
    for value in (SECRET, AWS_KEY):
        verdict = ENGINE.inspect(_subject(f"blob {prefix}{value.encode().hex()} end"))
        assert not verdict.allowed, (prefix, value)


# --- the real gateway ------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("b64-alignment", secrets_=[SECRET, SHORTEST]) as started:
        yield started


def test_the_shortest_configured_value_in_base64_is_refused(gw: tuple[Env, GatewayThread]) -> None:
    """A value of the default shortest length (8 bytes) is 11 base64 characters once its
    '=' is dropped: refused bare, padded and behind a prefix, in either alphabet."""
    env, gateway = gw
    for encode in (_std, _url):
        for encoded in (encode(SHORTEST).decode(), encode(SHORTEST).decode().rstrip("=")):
            for text in (encoded, f"token={encoded}", f"id-{encoded} done"):
                body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}
                r = post_json(gateway, env, "/v1/chat/completions", body)
                assert r.status_code == 403, text
                assert r.json()["error"]["reason_codes"] == ["secret_value"]


def _last_seq(mock: MockProviderServer) -> int:
    records = mock.state.records()
    return records[-1].seq if records else 0


def test_request_with_the_value_in_a_url_path_is_refused(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    encoded = _std(SECRET).decode()
    since = _last_seq(mock)
    body = {
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": f"fetch https://files.example.org/d/{encoded}"}],
    }
    r = post_json(gateway, env, "/v1/chat/completions", body)
    assert r.status_code == 403
    assert r.json()["error"]["reason_codes"] == ["secret_value"]
    assert _last_seq(mock) == since  # nothing reached the provider
    # the control: the same request with another file is sent
    body["messages"][0]["content"] = f"fetch https://files.example.org/d/{_std('harmless-file-name').decode()}"
    assert post_json(gateway, env, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_response_with_the_value_behind_an_id_prefix_is_withheld(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, stream: bool
) -> None:
    env, gateway = gw
    encoded = _std(SECRET).decode()
    sid = "b" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"text": f"your file: id-{encoded} ok", "chunk_size": 5}])
    body = {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    r = raw_client(gateway, env).post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "response_blocked"
    assert r.json()["error"]["reason_codes"] == ["secret_value"]
    assert encoded not in r.text and encoded[8:] not in r.text


# --- the native finder against the reference ---------------------------------------------


def _both(data: bytes) -> list[tuple[int, bytes]]:
    decoders.use_native(True)
    native = decoders.run_decodings(data)
    decoders.use_native(False)
    reference = decoders.run_decodings(data)
    decoders.use_native(True)
    assert native == reference, data[:200]
    return native


PREFIX_CHARS = b"AZaz09+/-_"


@needs_native
@settings(max_examples=1500, deadline=None)
@given(
    st.integers(0, 7),
    st.data(),
    st.binary(min_size=1, max_size=48),
    st.sampled_from(["std", "url"]),
    st.booleans(),
    st.sampled_from([b" ", b".", b"=", b"", b"\x00", b"xY"]),
)
def test_native_matches_reference_behind_prefixes(
    k: int, data: st.DataObject, value: bytes, kind: str, padded: bool, around: bytes
) -> None:
    """Every prefix length 0-7 of any alphabet characters (both alphabets mixed), before
    either encoding of any value: the same copies at the same offsets, in the same order;
    and, the run ending at a non-alphabet character, the value in some copy whenever the run
    is decoded from the encoding's alignment (with `MIN_B64_RUN` characters left there)."""
    prefix = bytes(data.draw(st.lists(st.sampled_from(PREFIX_CHARS), min_size=k, max_size=k)))
    encoded = base64.b64encode(value) if kind == "std" else base64.urlsafe_b64encode(value)
    if not padded:
        encoded = encoded.rstrip(b"=")
    runs = _both(around + prefix + encoded + around)
    run = prefix + encoded.rstrip(b"=")
    decoded = len(run) >= decoders.MIN_B64_RUN and not (run.islower() or run.isupper())
    aligned = k % 4 == 0 or len(run) - k % 4 >= decoders.MIN_B64_RUN
    if around in (b" ", b".", b"\x00") and decoded and aligned:
        assert any(value in copy for _, copy in runs)


@needs_native
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(b"Aa0fF+/-_= .\x00"), max_size=200).map(bytes))
def test_native_matches_reference_on_mixed_alphabets(data: bytes) -> None:
    _both(data)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(PREFIX_CHARS), max_size=7).map(bytes),
            st.binary(min_size=6, max_size=30),
            st.sampled_from([b" ", b"\x00", b"=", b"; "]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_native_matches_reference_on_many_runs(parts: list[tuple[bytes, bytes, bytes]]) -> None:
    """Many runs in one buffer (the order of the copies from every alignment)."""
    _both(b"".join(prefix + base64.b64encode(value) + sep for prefix, value, sep in parts))


@needs_native
@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("n", range(8, 20))
def test_native_matches_reference_at_every_length_and_prefix(k: int, n: int) -> None:
    for prefix_chars in (b"a-Z_0", b"a/Z+0", b"-/_+9"):
        prefix = (prefix_chars * 2)[:k]
        for body in (b"Ab1" * 7, b"aB+/" * 5, b"aB-_" * 5, b"aB-/" * 5):
            for pad in (b"", b"=", b"=="):
                _both(b"<" + prefix + body[:n] + pad + b">")


@pytest.mark.parametrize("native", FINDERS)
def test_a_decoded_copy_names_the_unit_it_came_from(native: bool) -> None:
    """Decoded copies find their unit only when a scan hits one (by offset): each finding
    names the message whose encoded text held the value, whatever comes before it."""
    decoders.use_native(native)
    b64 = _std(SECRET).decode()
    hexed = SECRET.encode().hex()
    percent = "".join(f"%{b:02x}" for b in SECRET.encode())
    cases = [
        (["harmless first message", f"token {b64}", "third"], 1),
        ([f"see {b64} here", "second", "third"], 0),
        (["one", "two", f"blob {hexed} end"], 2),
        (["one", f"q={percent}", "three"], 1),
        (["one", "two", "three", _std(f"nested {b64} inside").decode()], 3),  # base64 of base64
    ]
    for texts, index in cases:
        raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": t} for t in texts]}).encode()
        parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
        verdict = ENGINE.inspect(Subject(raw=None, units=parsed.units))
        assert not verdict.allowed, texts
        pointers = {f.pointer for f in verdict.findings if f.reason == "secret_value"}
        assert pointers == {f"/messages/{index}/content"}, (texts, pointers)
