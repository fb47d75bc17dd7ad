"""Names in other languages count as context: 密钥: V, clave=V, Schlüssel: V, パスワード：V."""

from __future__ import annotations

import json
import unicodedata

import hyperscan
import pytest

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection.build import build_engine
from gateway.inspection.catalogue import Catalogue, FormatMatch, confirm_in_window, load_catalogue, reference_scan
from gateway.inspection.engine import Subject
from gateway.inspection.formats import build_format_set

from . import foreign_names as fn

CAT = load_catalogue()
RULES = {r.id: r for r in CAT.rules}
#: rule id -> (its names in other languages, a value the rule accepts)
EXTENDED: dict[str, tuple[tuple[str, ...], str]] = {
    "generic-password": (fn.PASSWORD_NAMES, "Zq8!vN2x-Lp4Rt"),
    "generic-api-key": (fn.KEY_NAMES, "Zq8vN2xLp4Rt7WmKa9B3cD5eF7gH"),
    "aws-secret-access-key": (fn.AWS_SECRET_NAMES, "Zq8vN2xLp4Rt7/WmKa9B3cD5eF7gH+1aB2cD3eF4"),
}
GLUES = (": ", "=", " = ", "：", "＝", "是", "是：", "は", "は「", "는 ", ' : "', "=“")


def _spellings(name: str) -> list[str]:
    """The name as written, capitalised, and (Latin script) upper-cased."""
    out = [name, name[0].upper() + name[1:]]
    if all(c.isascii() or not c.isalpha() or unicodedata.name(c).startswith("LATIN") for c in name):
        out.append(name.upper())
    return list(dict.fromkeys(out))


def _cases() -> list[tuple[str, str, str]]:
    return [
        (rid, spelled + glue, value)
        for rid, (names, value) in EXTENDED.items()
        for name in names
        for spelled in _spellings(name)
        for glue in GLUES
    ]


def test_patterns_are_generated_from_the_name_lists() -> None:
    """The catalogue holds exactly the fragments foreign_names.py generates (kept in sync)."""
    for rid, (names, _value) in EXTENDED.items():
        rule = RULES[rid]
        assert fn.alternation(names) in rule.pattern, rid
        assert fn.GLUE in rule.pattern, rid
        assert rule.pattern.isascii()
        assert set(fn.keywords(names)) <= set(rule.keywords), rid


def test_every_spelling_contains_a_keyword() -> None:
    """The reference engine's keyword prefilter never skips a name the pattern accepts."""
    for rid, text, _value in _cases():
        lowered = text.encode().lower()
        assert any(k.encode() in lowered for k in RULES[rid].keywords), (rid, text)


@pytest.fixture(scope="module")
def hs_db() -> hyperscan.Database:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    rules = [RULES[rid] for rid in EXTENDED]
    db.compile(
        expressions=[r.pattern.encode() for r in rules],
        ids=list(range(len(rules))),
        elements=len(rules),
        flags=[0] * len(rules),
    )
    return db


def test_names_in_other_languages_are_found_by_both_engines(hs_db: hyperscan.Database) -> None:
    rules = [RULES[rid] for rid in EXTENDED]
    missed: list[str] = []
    for rid, prefix, value in _cases():
        data = ("note " + prefix + value + " end").encode()
        expected = reference_scan(Catalogue("t", (RULES[rid],)), data)
        ends: set[tuple[int, int]] = set()

        def on_match(i: int, _f: int, to: int, _fl: int, _c: object, ends: set[tuple[int, int]] = ends) -> None:
            ends.add((i, to))

        hs_db.scan(data, match_event_handler=on_match)
        got: set[FormatMatch] = set()
        for index, end in ends:
            if rules[index].id == rid:
                got.update(confirm_in_window(rules[index], data, end))
        assert set(expected) == got, (rid, prefix)
        at = data.find(value.encode())
        if not any(m.start <= at and m.end >= at + len(value) for m in expected):
            missed.append(f"{rid}: {prefix!r}")
    assert not missed, missed


def test_names_in_other_languages_through_the_engine() -> None:
    """The issue's examples, sent as chat content (the engine also scans the NFKC copy)."""
    engine = build_engine(
        secret_values=[],
        policy_version="t",
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
    )
    password, key = EXTENDED["generic-password"][1], EXTENDED["generic-api-key"][1]
    aws = EXTENDED["aws-secret-access-key"][1]
    cases = {
        "密钥: " + key: "generic-api-key",
        "clave=" + key: "generic-api-key",
        "Schlüssel: " + key: "generic-api-key",
        "令牌：" + key: "generic-api-key",
        "トークン: " + key: "generic-api-key",
        "パスワード：" + password: "generic-password",
        "contraseña: " + password: "generic-password",
        "mot de passe : " + password: "generic-password",
        "пароль: " + password: "generic-password",
        "비밀번호: " + password: "generic-password",
        "senha: " + password: "generic-password",
        "密码是" + password: "generic-password",
        "秘密访问密钥：" + aws: "aws-secret-access-key",
        "clé d'accès secrète : " + aws: "aws-secret-access-key",
    }
    for text, rid in cases.items():
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
        verdict = engine.inspect(Subject(raw=raw, units=parsed.units))
        assert f"secret_format:{rid}" in {f.reason for f in verdict.findings}, text


def test_names_without_a_value_do_not_fire() -> None:
    """Help-desk prose that names credentials (the benign corpus file) matches nothing, not
    even the advisory generic rules; nor do placeholders after a foreign name."""
    for text in (
        "パスワード = ${DB_PASSWORD}",
        '密码 = os.environ["DB_PASSWORD"]',
        "clave = <tu-clave>",
        "Passwort: mindestens zwölf Zeichen",
        "密钥是什么？",
        "トークン：有効期限切れです",
        "clave=valor",
        "Schlüssel: siehe Tresor",
        "秘密访问密钥：" + "x" * 40,
        "secret: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ):
        hits = [h.rule_id for h in reference_scan(CAT, text.encode()) if h.rule_id in EXTENDED]
        assert hits == [], (text, hits)
