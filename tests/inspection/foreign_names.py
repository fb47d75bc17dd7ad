"""Names of credentials in other languages, and the ASCII byte-regex fragments built from them.

"Names in other languages count as context": ``密钥: V``, ``clave=V``, ``Schlüssel: V`` and
``パスワード：V`` name a credential as surely as ``api_key = V``. The catalogue's patterns must
stay ASCII (Hyperscan and Python ``re`` both read ``\\xNN`` in a bytes pattern), so the name
alternations of ``generic-password``, ``generic-api-key`` and ``aws-secret-access-key`` are
generated from the lists below by :func:`alternation`, and the catalogue test checks that the
packaged patterns contain exactly these fragments (edit the lists, regenerate, paste).

Case: ``(?i)`` folds ASCII letters only (in both engines), so a non-ASCII letter is written
with its variants: accented Latin letters in both cases and with their plain-ASCII spelling
(``ü`` -> ``ü Ü ue u``), the first letter of a Cyrillic / Greek word in both cases
(``Пароль``, ``пароль``). Every name yields one *keyword* (the reference engine's prefilter):
the longest ASCII-letter run of the name when it has one (bytes are lowered before the
search), otherwise its longest word, without the first letter when that letter is cased.
"""

from __future__ import annotations

import re
import unicodedata

#: Password, in other languages (generic-password; English names are already there).
PASSWORD_NAMES: tuple[str, ...] = (
    "passwort",
    "kennwort",  # de
    "contraseña",  # es
    "mot de passe",  # fr
    "senha",  # pt
    "wachtwoord",  # nl
    "hasło",  # pl
    "lösenord",
    "adgangskode",
    "passord",
    "salasana",
    "heslo",
    "şifre",  # sv da no fi cs tr
    "пароль",  # ru uk
    "密码",
    "密碼",
    "口令",  # zh
    "パスワード",
    "暗証番号",  # ja
    "비밀번호",
    "패스워드",
    "암호",  # ko
    "كلمة المرور",
    "كلمة السر",  # ar
    "पासवर्ड",  # hi
)

#: Key / token / secret, in other languages (generic-api-key). The issue's own examples
#: (``clave``, ``Schlüssel``) mean just "key": in English a bare ``key`` is not a name, but in
#: these languages the word is how people label an API key.
KEY_NAMES: tuple[str, ...] = (
    "schlüssel",
    "zugangsschlüssel",
    "zugriffsschlüssel",
    "geheimschlüssel",  # de
    "clave",
    "llave",
    "secreto",  # es
    "clé",
    "clef",
    "jeton",  # fr
    "chave",
    "segredo",  # pt
    "chiave",
    "segreto",  # it
    "sleutel",  # nl
    "klucz",  # pl
    "anahtar",  # tr
    "ключ",
    "токен",
    "секрет",  # ru
    "密钥",
    "秘钥",
    "密鑰",
    "金鑰",
    "密匙",
    "令牌",
    "API密钥",
    "API秘钥",
    "API密鑰",
    "API金鑰",  # zh
    "トークン",
    "シークレット",
    "シークレットキー",
    "アクセスキー",
    "APIキー",
    "秘密鍵",  # ja
    "토큰",
    "비밀 키",
    "액세스 키",
    "API 키",
    "시크릿",  # ko
    "مفتاح",  # ar
    "कुंजी",
    "टोकन",  # hi
)

#: The AWS console's own translations of "secret access key" (aws-secret-access-key).
AWS_SECRET_NAMES: tuple[str, ...] = (
    "秘密访问密钥",
    "私有访问密钥",
    "私密存取金鑰",
    "秘密存取金鑰",  # zh-CN, zh-TW
    "シークレットアクセスキー",  # ja
    "비밀 액세스 키",  # ko
    "clave de acceso secreta",  # es
    "clé d'accès secrète",  # fr
    "geheimer zugriffsschlüssel",  # de
    "chave de acesso secreta",  # pt
    "chiave di accesso segreta",  # it
    "секретный ключ доступа",  # ru
)

#: What joins a name to its value, beyond ``: = := =>``: the full-width colon and equals
#: sign, and the copula / topic particle of Chinese (是 为 為), Japanese (は) and Korean (는 은),
#: optionally followed by a colon (``密钥是：V``); then an optional opening quote 「 “ ‘ «.
GLUE_WORDS: tuple[str, ...] = ("是", "为", "為", "は", "는", "은")
FULLWIDTH_GLUE: tuple[str, ...] = ("：", "＝")
OPENING_QUOTES: tuple[str, ...] = ("「", "“", "‘", "«")

_FOLD = {
    "ü": ("ue", "u"),
    "ö": ("oe", "o"),
    "ä": ("ae", "a"),
    "ñ": ("n",),
    "é": ("e",),
    "è": ("e",),
    "ł": ("l",),
    "ş": ("s",),
    "ç": ("c",),
    "ó": ("o",),
}


def _bytes(text: str) -> str:
    return "".join(f"\\x{b:02x}" for b in text.encode("utf-8"))


def _alt(options: list[str]) -> str:
    unique = list(dict.fromkeys(options))
    return unique[0] if len(unique) == 1 else "(?:" + "|".join(unique) + ")"


def byte_regex(name: str) -> str:
    """An ASCII regex (to be used under ``(?i)``) matching the UTF-8 bytes of ``name``."""
    out: list[str] = []
    for i, ch in enumerate(name):
        if ch == " ":
            out.append("[ _-]?")
        elif ch == "'":
            out.append("(?:'|" + _bytes("\u2019") + ")")
        elif ch.isascii():
            out.append(re.escape(ch))
        else:
            latin = unicodedata.name(ch, "").startswith("LATIN")
            options = [ch]
            if ch.lower() != ch.upper() and (latin or i == 0):
                options += [ch.lower(), ch.upper()]
            encoded = [_bytes(o) for o in options]
            encoded += list(_FOLD.get(ch.lower(), ()) if latin else ())
            out.append(_alt(encoded))
    return "".join(out)


def keyword(name: str) -> str:
    """The prefilter keyword that every spelling :func:`byte_regex` accepts contains."""
    runs = re.findall(r"[A-Za-z]+", name)
    if runs:
        return max(runs, key=len).lower()
    parts = [p for p in name.split(" ") if p]
    part = max(parts, key=len)
    if part[0].lower() != part[0].upper() and part is parts[0]:
        part = part[1:]  # the first letter comes in two cases
    return part.lower()


def alternation(names: tuple[str, ...]) -> str:
    """One non-capturing alternation of all names, longest first (so the longest wins)."""
    return "(?:" + "|".join(byte_regex(n) for n in sorted(names, key=lambda n: (-len(n), n))) + ")"


def keywords(names: tuple[str, ...]) -> list[str]:
    return list(dict.fromkeys(keyword(n) for n in names))


#: The name-to-value glue shared by the three rules (replaces ``…(?::=|=>|[:=])…``).
QUOTES = "[\\\\\\\"'` \\t]{0,8}"
GLUE = (
    QUOTES
    + "(?::=|=>|[:=]|"
    + "|".join(_bytes(g) for g in FULLWIDTH_GLUE)
    + "|"
    + _alt([_bytes(g) for g in GLUE_WORDS])
    + "[ \\t]{0,4}(?:[:=]|"
    + _bytes("：")
    + ")?)"
    + QUOTES
    + "(?:"
    + "|".join(_bytes(q) for q in OPENING_QUOTES)
    + ")?"
)
#: Before a non-English name: an optional ASCII word and separator (``API-``, ``Mein ``).
FOREIGN_PREFIX = "(?:[A-Za-z0-9_.-]{0,24}[ _.-])?"
#: After a key name: up to two ASCII qualifier words (``clave de acceso``, ``clé API``).
FOREIGN_QUALIFIERS = "(?:[ _-][A-Za-z0-9_.'-]{1,16}){0,2}"
