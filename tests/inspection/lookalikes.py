"""Seeded realistic non-secrets shaped like bare credentials, by category.

A bare-credential rule has no name to lean on, so its precision is measured on values that
look like keys but are not: digests, ids, encodings and identifiers that real requests carry
(tool arguments full of commit SHAs, trace ids, file ids, lock-file hashes, code).
Every generator is deterministic for a given seed.

Some values are kept apart (:func:`same_shape`): base64 of exactly 30 random bytes *is* the
shape of an AWS secret key (30 random bytes, encoded), and random hex of exactly 37
characters that of a Cloudflare global key, so no acceptance check can reject them; they are
reported, not bounded.
"""

from __future__ import annotations

import base64
import hashlib
import random
import string
import uuid
from collections.abc import Callable

ALNUM = string.ascii_letters + string.digits
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

WORDS = (
    "user",
    "profile",
    "account",
    "settings",
    "order",
    "invoice",
    "payment",
    "customer",
    "report",
    "export",
    "import",
    "service",
    "handler",
    "controller",
    "manager",
    "factory",
    "builder",
    "adapter",
    "client",
    "server",
    "request",
    "response",
    "session",
    "token",
    "cache",
    "store",
    "queue",
    "worker",
    "job",
    "task",
    "event",
    "message",
    "channel",
    "config",
    "value",
    "data",
    "item",
    "list",
    "map",
    "index",
    "view",
    "model",
    "page",
    "table",
    "column",
    "field",
    "record",
    "update",
    "create",
    "delete",
    "fetch",
    "load",
    "save",
    "render",
    "parse",
    "format",
    "validate",
    "resolve",
    "dispatch",
    "primary",
    "secondary",
    "default",
    "legacy",
    "internal",
    "external",
    "public",
    "private",
    "shared",
    "local",
    "dashboard",
    "analytics",
    "billing",
    "shipping",
    "inventory",
    "catalog",
    "product",
    "search",
    "filter",
    "sort",
)


def _b58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, rem = divmod(n, 58)
        out = B58[rem] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _camel(r: random.Random, n_words: int, upper_first: bool = False) -> str:
    words = [r.choice(WORDS) for _ in range(n_words)]
    head = words[0].capitalize() if upper_first else words[0]
    return head + "".join(w.capitalize() for w in words[1:])


def _with_digits(r: random.Random, text: str) -> str:
    return text + str(r.randint(1, 2099))


def _exact(r: random.Random, make: Callable[[], str], length: int, tries: int = 500) -> str | None:
    for _ in range(tries):
        s = make()
        if len(s) >= length:
            return s[:length] if not s[length - 1 : length].isspace() else None
    return None


def _path(r: random.Random) -> str:
    segments = []
    for _ in range(r.randint(3, 7)):
        kind = r.random()
        if kind < 0.4:
            segments.append(_camel(r, r.randint(1, 2), upper_first=r.random() < 0.5))
        elif kind < 0.6:
            segments.append(_with_digits(r, r.choice(WORDS).capitalize()))
        elif kind < 0.8:
            segments.append(r.choice(["src", "app", "lib", "api", "v1", "v2", "Http", "Models", "Views", "components"]))
        else:
            segments.append(r.choice(WORDS))
    return ("/" if r.random() < 0.5 else "") + "/".join(segments)


def _identifier(r: random.Random, sep: str) -> str:
    parts = []
    for _ in range(r.randint(3, 8)):
        w = r.choice(WORDS)
        roll = r.random()
        if roll < 0.3:
            w = w.capitalize()
        elif roll < 0.4:
            w = w.upper()
        elif roll < 0.55:
            w = _with_digits(r, w)
        parts.append(w)
    return sep.join(parts)


def categories(seed: int = 2026, n: int = 400) -> dict[str, list[str]]:
    """``n`` look-alikes per category (fewer where a category is small by nature)."""
    r = random.Random(seed)  # noqa: S311 - deterministic test data

    def rb(k: int) -> bytes:
        return r.randbytes(k)

    def many(fn: Callable[[], str | None]) -> list[str]:
        out: list[str] = []
        for _ in range(n * 3):
            v = fn()
            if v:
                out.append(v)
            if len(out) == n:
                break
        return out

    cats: dict[str, list[str]] = {
        "git-sha": many(lambda: rb(20).hex()),
        "git-sha-short": many(lambda: rb(6).hex()[: r.choice((7, 8, 10, 12))]),
        "sha256-hex": many(lambda: hashlib.sha256(rb(16)).hexdigest()),
        "sha512-hex": many(lambda: hashlib.sha512(rb(16)).hexdigest()),
        "md5-hex": many(lambda: hashlib.md5(rb(16)).hexdigest()),  # noqa: S324 - test data
        "hex-upper": many(lambda: rb(r.choice((16, 20, 32))).hex().upper()),
        "uuid": many(lambda: str(uuid.UUID(bytes=rb(16), version=4))),
        "uuid-upper": many(lambda: str(uuid.UUID(bytes=rb(16), version=4)).upper()),
        "uuid-nohyphen": many(lambda: uuid.UUID(bytes=rb(16), version=4).hex),
        "trace-w3c": many(lambda: f"00-{rb(16).hex()}-{rb(8).hex()}-01"),
        "trace-xray": many(lambda: f"Root=1-{rb(4).hex()}-{rb(12).hex()};Parent={rb(8).hex()};Sampled=1"),
        "trace-b3": many(lambda: f"{rb(16).hex()}-{rb(8).hex()}-1"),
        "trace-datadog": many(lambda: str(r.getrandbits(63))),
        "trace-jaeger": many(lambda: f"{rb(16).hex()}:{rb(8).hex()}:0:1"),
        "span-id": many(lambda: rb(8).hex()),
        "b64-digest": many(lambda: base64.b64encode(rb(r.choice((16, 20, 32, 48, 64)))).decode()),
        "b64-digest-nopad": many(lambda: base64.b64encode(rb(r.choice((16, 20, 32, 48, 64)))).decode().rstrip("=")),
        "b64url-digest": many(lambda: base64.urlsafe_b64encode(rb(r.choice((16, 32, 64)))).decode().rstrip("=")),
        "b64-random-common": many(lambda: base64.b64encode(rb(r.choice((8, 12, 18, 24, 36, 42, 60, 96)))).decode()),
        "npm-integrity": many(
            lambda: (
                r.choice(("sha512-", "sha384-", "sha256-", "sha1-"))
                + base64.b64encode(rb(r.choice((64, 48, 32, 20)))).decode()
            )
        ),
        "go-sum": many(lambda: "h1:" + base64.b64encode(rb(32)).decode()),
        "docker-digest": many(lambda: "sha256:" + rb(32).hex()),
        "drive-file-id": many(lambda: "1" + base64.urlsafe_b64encode(rb(33)).decode()[:43]),
        "youtube-id": many(lambda: base64.urlsafe_b64encode(rb(9)).decode()[:11]),
        "youtube-playlist": many(lambda: "PL" + base64.urlsafe_b64encode(rb(24)).decode()),
        "firebase-uid": many(lambda: "".join(r.choice(ALNUM) for _ in range(28))),
        "ksuid": many(lambda: "".join(r.choice(ALNUM) for _ in range(27))),
        "ulid": many(lambda: "".join(r.choice(CROCKFORD) for _ in range(26))),
        "nanoid": many(lambda: "".join(r.choice(ALNUM + "_-") for _ in range(21))),
        "salesforce-id": many(lambda: "001" + "".join(r.choice(ALNUM) for _ in range(15))),
        "mongo-objectid": many(lambda: rb(12).hex()),
        "solana-address": many(lambda: _b58(rb(32))),
        "bitcoin-address": many(lambda: _b58(b"\0" + rb(24))),
        "ipfs-cid": many(lambda: _b58(b"\x12\x20" + rb(32))),
        "ethereum-address": many(lambda: "0x" + "".join(c.upper() if r.random() < 0.5 else c for c in rb(20).hex())),
        "camel-identifier": many(lambda: _camel(r, r.randint(3, 7), upper_first=r.random() < 0.4)),
        "camel-identifier-40": many(lambda: _exact(r, lambda: _with_digits(r, _camel(r, 8)), 40)),
        "snake-identifier": many(lambda: _identifier(r, "_")),
        "snake-identifier-40": many(lambda: _exact(r, lambda: _identifier(r, "_") + "_" + _identifier(r, "_"), 40)),
        "kebab-slug": many(lambda: _identifier(r, "-")),
        "kebab-slug-40": many(lambda: _exact(r, lambda: _identifier(r, "-") + "-" + _identifier(r, "-"), 40)),
        "test-method-name": many(
            lambda: (
                _camel(r, r.randint(3, 5))
                + "_"
                + _camel(r, r.randint(3, 5))
                + (str(r.randint(1, 9)) if r.random() < 0.5 else "")
            )
        ),
        "file-path": many(lambda: _path(r)),
        "file-path-40": many(lambda: _exact(r, lambda: _path(r) + "/" + _path(r), 40)),
        "minified-js": many(
            lambda: "".join(
                r.choice(("e", "t", "n", "r", "o", "i", "a", "s", "_0x" + rb(2).hex()))
                + r.choice(("=", ".", "(", ")", ",", "+", "&&", "?", ":", ";", "[", "]"))
                for _ in range(r.randint(10, 40))
            )
        ),
        "source-map-mappings": many(
            lambda: ";".join(
                ",".join(
                    "".join(r.choice(ALNUM + "+/") for _ in range(r.choice((4, 5, 6, 7, 8))))
                    for _ in range(r.randint(1, 6))
                )
                for _ in range(r.randint(2, 8))
            )
        ),
    }
    return cats


#: Values that are the secret's own distribution (see the module docstring).
def same_shape(seed: int = 2026, n: int = 400) -> dict[str, list[str]]:
    r = random.Random(seed)  # noqa: S311 - deterministic test data
    return {
        "b64-30-bytes": [base64.b64encode(r.randbytes(30)).decode() for _ in range(n)],
        "b64url-30-bytes": [base64.urlsafe_b64encode(r.randbytes(30)).decode() for _ in range(n)],
        "hex-37": [r.randbytes(19).hex()[:37] for _ in range(n)],
    }
