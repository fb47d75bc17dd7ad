"""Look-alike letters, digits and dashes: a value written with Cyrillic, Greek or Armenian
letters drawn like the Latin ones, another script's decimal digits, a non-breaking hyphen,
a dash or the minus sign, or negative squared capitals reads as that value to anyone who
sees it, and NFKC leaves all of them as they are. The normalised copy reads each as its
ASCII character (`decoders.fold_forms`), so such a form of a configured value or of a
catalogue credential is refused; configured values that hold such characters themselves
are matched as written and folded; ordinary Russian, Greek and Arabic text is untouched in
what it allows. The native fold and flags are the reference's, code point by code point."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection import decoders
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Engine, Subject
from gateway.inspection.formats import build_format_set
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json

SECRET = "plain-literal-0123456789"
CYRILLIC_SECRET = "пароль-Секрет-2024-ключ"  # a configured value that is Cyrillic itself
AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"

CYRILLIC = dict(zip("aeopcxyiAEOPCXHKMTBIJS", "аеорсхуіАЕОРСХНКМТВІЈЅ", strict=True))
GREEK = dict(zip("AEOPTXHKMNZIBoiv", "ΑΕΟΡΤΧΗΚΜΝΖΙΒοιν", strict=True))
ARABIC_INDIC = {str(d): chr(0x660 + d) for d in range(10)}
DEVANAGARI = {str(d): chr(0x966 + d) for d in range(10)}


def _swap(text: str, table: dict[str, str]) -> str:
    return "".join(table.get(c, c) for c in text)


FORMS = {
    "cyrillic_letters": lambda v: _swap(v, CYRILLIC),
    "greek_letters": lambda v: _swap(v, GREEK),
    "non_breaking_hyphens": lambda v: v.replace("-", "\u2011"),
    "minus_signs": lambda v: v.replace("-", "\u2212"),
    "en_dashes": lambda v: v.replace("-", "\u2013"),
    "arabic_indic_digits": lambda v: _swap(v, ARABIC_INDIC),
    "devanagari_digits": lambda v: _swap(v, DEVANAGARI),
    "all_at_once": lambda v: _swap(_swap(v, CYRILLIC), ARABIC_INDIC).replace("-", "\u2011"),
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(
        secret_values=[SECRET, CYRILLIC_SECRET],
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
        policy_version="t",
    )


@pytest.fixture(params=[True, False], ids=["native", "reference"])
def finder(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.param and not decoders.NATIVE_AVAILABLE:
        pytest.skip("the native module is not built")
    decoders.use_native(request.param)
    yield
    decoders.use_native(True)


def _subject(text: str) -> Subject:
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
    return Subject(raw=raw, units=parsed.units)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_configured_value_in_look_alike_characters_is_refused(engine: Engine, finder: None, form: str) -> None:
    written = FORMS[form](SECRET)
    assert written != SECRET and SECRET not in written
    assert engine.inspect(_subject(f"the value is {written} ok")).reason_codes == ("secret_value",)


def test_negative_squared_and_circled_capitals_read_as_letters(finder: None) -> None:
    squared = "".join(chr(0x1F170 + ord(c) - 0x41) for c in "PLAIN")  # 🅿🅻🅰🅸🅽
    circled = "".join(chr(0x1F150 + ord(c) - 0x41) for c in "PLAIN")
    assert decoders.normalise(f"{squared} {circled}") == "PLAIN PLAIN"


@pytest.mark.parametrize("form", ["cyrillic_letters", "greek_letters"])
def test_a_catalogue_credential_in_look_alike_letters_is_refused(engine: Engine, finder: None, form: str) -> None:
    written = FORMS[form](AWS_KEY)
    assert written != AWS_KEY
    verdict = engine.inspect(_subject(f"aws key {written} here"))
    assert not verdict.allowed and any(r.startswith("secret_format:") for r in verdict.reason_codes)


def test_a_configured_value_that_is_cyrillic_itself_is_refused_as_written_and_hidden(
    engine: Engine, finder: None
) -> None:
    assert engine.inspect(_subject(f"x {CYRILLIC_SECRET} y")).reason_codes == ("secret_value",)
    hidden = "\u200b".join(CYRILLIC_SECRET)  # the normalised copy removes the zero-width spaces, folds the letters
    assert engine.inspect(_subject(f"x {hidden} y")).reason_codes == ("secret_value",)


@pytest.mark.parametrize(
    "text",
    [
        "Это обычный текст о погоде: сегодня тепло, 25 градусов, завтра дождь.",
        "Καλημέρα! Ο καιρός σήμερα είναι καλός και η θερμοκρασία είναι 25 βαθμοί.",
        "الرقم ١٢٣٤٥ هو رقم الطلب — شكراً لكم",
        "range 10–20, temperature −5 °C, a non‑breaking hyphen",
    ],
)
def test_ordinary_text_in_those_scripts_is_allowed(engine: Engine, finder: None, text: str) -> None:
    assert engine.inspect(_subject(text)).allowed


def test_folding_is_one_character_for_one(finder: None) -> None:
    """What the release window counts is unchanged: every folded character is one ASCII one."""
    text = "".join(chr(cp) for cp in sorted(decoders._LOOKALIKE))
    folded = decoders.fold_forms(text)
    assert len(folded) == len(text) and folded.isascii()
    assert decoders.fold_forms("plain ascii") == "plain ascii"


def test_native_fold_and_flags_are_the_references_for_every_code_point() -> None:
    if not decoders.NATIVE_AVAILABLE:
        pytest.skip("the native module is not built")
    differ = []
    try:
        for cp in range(0x80, 0x110000):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            ch = chr(cp)
            decoders.use_native(True)
            native = decoders.fold_forms(ch), decoders.text_flags(ch) & decoders.LOOKALIKE
            decoders.use_native(False)
            if native != (decoders.fold_forms(ch), decoders.text_flags(ch) & decoders.LOOKALIKE):
                differ.append(hex(cp))
    finally:
        decoders.use_native(True)
    assert differ == []
    # and within texts of every width, the result is a canonical str (equal to the reference's)
    for text in ("é рlаіn", "рlаіn", "\U0001f600 рlаіn ٠١", "٠١٢", "x\u2011y"):
        decoders.use_native(True)
        native = decoders.fold_forms(text)
        decoders.use_native(False)
        assert native == decoders.fold_forms(text) and hash(native) == hash(decoders.fold_forms(text))
    decoders.use_native(True)


# --- the real gateway ------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("lookalikes", secrets_=[SECRET]) as started:
        yield started


@pytest.mark.parametrize("form", ["cyrillic_letters", "non_breaking_hyphens", "arabic_indic_digits"])
def test_the_gateway_refuses_a_look_alike_value_before_send(gw: tuple[Env, GatewayThread], form: str) -> None:
    env, gateway = gw
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"use {FORMS[form](SECRET)} please"}]}
    r = post_json(gateway, env, "/v1/chat/completions", body)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["reason_codes"] == ["secret_value"]  # the OpenAI dialect's error object
