"""Realistic random secrets (true positives) and near-misses (false positives) per rule.

Every catalogue rule has a *shape* built from small parts:

* ``str``            a literal;
* ``tuple``          a choice between parts (the first option is the canonical one);
* ``list``           a sequence of parts;
* :class:`R`         a random run over an alphabet (``pat`` = the length range the rule accepts,
                     when it differs from the generated range);
* :class:`A`         ``NAME <glue> VALUE`` assignment in one of several syntaxes (env, YAML,
                     JSON, Python, shell, Go);
* :class:`F`         a custom generator function.

A spec may also name a ``keep`` filter: ``true_positives`` then draws until it has ``n`` samples
the filter accepts. Bare rules use it to keep the samples their acceptance checks pass (the
share they reject is measured separately, as recall, in ``test_bare_credentials``).

``true_positives`` draws from the shape with a seeded ``random.Random``. ``false_positives``
returns hand-picked near-misses per rule: mutations of the canonical shape chosen per rule
(one char short / long, a character outside the alphabet, a flat low-entropy body, the
prefix glued to a longer word) plus explicit strings (published example keys, placeholders,
templates, look-alikes).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

from gateway.inspection import catalogue as _catalogue

ALNUM = string.ascii_letters + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
LETTERS = string.ascii_letters
DIGITS = string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "_-"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
#: password characters used in URLs / connection strings (no quote, backslash, @, /, :)
PW = ALNUM + "!*-_.~"


@dataclass(frozen=True)
class R:
    alphabet: str
    lo: int
    hi: int | None = None
    pat: tuple[int, int] | None = None  # lengths the rule accepts, if not (lo, hi)

    def pat_bounds(self) -> tuple[int, int]:
        return self.pat or (self.lo, self.hi or self.lo)


@dataclass(frozen=True)
class F:
    fn: Callable[[random.Random], str]


STYLES: tuple[str, ...] = (
    "{n}={v}",
    "{n}: {v}",
    '"{n}": "{v}"',
    "{n} = '{v}'",
    'export {n}="{v}"',
    '{n} := "{v}"',
)
COLON_EQ_STYLES: tuple[str, ...] = ("{n}={v}", "{n}: {v}", '"{n}": "{v}"', "{n} = '{v}'")


@dataclass(frozen=True)
class A:
    names: tuple[str, ...]
    value: tuple[Part, ...]
    styles: tuple[str, ...] = STYLES


Part = Union[str, tuple, list, R, A, F]  # noqa: UP007 - runtime alias


@dataclass(frozen=True)
class Spec:
    shape: Part
    auto: tuple[str, ...] = ("short", "long", "badchar", "flat", "embedded")
    fps: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)
    keep: Callable[[str], bool] | None = None


# ---------------------------------------------------------------------------- rendering


class _Render:
    """Renders a shape; optionally applies one mutation to the target random run."""

    def __init__(
        self,
        rng: random.Random,
        canonical: bool = False,
        mutation: str | None = None,
        target: int = -1,
    ) -> None:
        self.rng = rng
        self.canonical = canonical
        self.mutation = mutation
        self.target = target
        self.runs: list[R] = []

    def __call__(self, part: Part) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, tuple):
            return self(part[0] if self.canonical else self.rng.choice(part))
        if isinstance(part, list):
            return "".join(self(p) for p in part)
        if isinstance(part, R):
            return self._run(part)
        if isinstance(part, A):
            name = part.names[0] if self.canonical else self.rng.choice(part.names)
            style = part.styles[0] if self.canonical else self.rng.choice(part.styles)
            value = "".join(self(p) for p in part.value)
            return style.format(n=name, v=value)
        if isinstance(part, F):
            return part.fn(self.rng)
        raise TypeError(part)

    def _run(self, run: R) -> str:
        index = len(self.runs)
        self.runs.append(run)
        lo, hi = run.lo, run.hi or run.lo
        pat_lo, pat_hi = run.pat_bounds()
        alnum = "".join(c for c in run.alphabet if c.isalnum())
        if self.mutation == "flat":
            return alnum[0] * lo
        if index == self.target:
            if self.mutation == "short":
                return "".join(self.rng.choice(run.alphabet) for _ in range(pat_lo - 1))
            if self.mutation == "long":
                return "".join(self.rng.choice(alnum) for _ in range(pat_hi + 1))
            if self.mutation == "badchar":
                n = max(lo, pat_lo)
                chars = [self.rng.choice(run.alphabet) for _ in range(n)]
                bad = next(c for c in "_gG!~ " if c not in run.alphabet)
                chars[pat_lo // 2] = bad
                return "".join(chars)
        n = lo if self.canonical else self.rng.randint(lo, hi)
        return "".join(self.rng.choice(run.alphabet) for _ in range(n))


def _mutant(spec: Spec, kind: str, rule_id: str) -> str:
    probe = _Render(random.Random(0), canonical=True)  # noqa: S311 - deterministic test data
    probe(spec.shape)
    runs = probe.runs
    # target: the run with the largest accepted minimum length (last one on ties)
    target = max(range(len(runs)), key=lambda i: (runs[i].pat_bounds()[0], i)) if runs else -1
    rng = random.Random(f"fp/{rule_id}/{kind}")  # noqa: S311 - deterministic test data
    if kind == "embedded":
        return "x" + _Render(rng, canonical=True)(spec.shape)
    return _Render(rng, canonical=True, mutation=kind, target=target)(spec.shape)


# ---------------------------------------------------------------------------- helpers


def _hexrun(n: int) -> R:
    return R(HEX, n)


UUID: list[Part] = [_hexrun(8), "-", _hexrun(4), "-", _hexrun(4), "-", _hexrun(4), "-", _hexrun(12)]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _pem(header: str, first: bytes, extra_headers: str = "", size: tuple[int, int] = (600, 1200)) -> F:
    def gen(r: random.Random) -> str:
        body = first + r.randbytes(r.randint(*size))
        text = base64.b64encode(body).decode()
        lines = [text[i : i + 64] for i in range(0, len(text), 64)]
        return f"-----BEGIN {header}-----\n{extra_headers}" + "\n".join(lines) + f"\n-----END {header}-----\n"

    return F(gen)


def _pgp(r: random.Random) -> str:
    text = base64.b64encode(b"\x95\x03\xc6\x04" + r.randbytes(r.randint(700, 1400))).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    crc = base64.b64encode(r.randbytes(3)).decode()
    return (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n"
        + r.choice(["", "Version: GnuPG v2\n"])
        + "\n"
        + "\n".join(lines)
        + f"\n={crc}\n-----END PGP PRIVATE KEY BLOCK-----\n"
    )


def _putty(r: random.Random) -> str:
    pub = base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + r.randbytes(270)).decode()
    priv = base64.b64encode(r.randbytes(r.randint(600, 700))).decode()

    def wrap(t: str) -> str:
        return "\n".join(t[i : i + 64] for i in range(0, len(t), 64))

    n_pub = len(wrap(pub).split("\n"))
    n_priv = len(wrap(priv).split("\n"))
    version = r.choice(["2", "3"])
    return (
        f"PuTTY-User-Key-File-{version}: ssh-rsa\nEncryption: none\n"
        f"Comment: rsa-key-2024{r.randint(1000, 9999)}\nPublic-Lines: {n_pub}\n{wrap(pub)}\n"
        f"Private-Lines: {n_priv}\n{wrap(priv)}\n"
        f"Private-MAC: {r.randbytes(32).hex()}\n"
    )


def _gcp_private_key(r: random.Random) -> str:
    text = base64.b64encode(
        bytes.fromhex("308204bd020100300d06092a864886f70d0101010500048204a7") + r.randbytes(r.randint(600, 1200))
    ).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return '"private_key": "-----BEGIN PRIVATE KEY-----\\n' + "\\n".join(lines) + '\\n-----END PRIVATE KEY-----\\n",'


def _jwt(r: random.Random) -> str:
    header = {"alg": r.choice(["RS256", "HS256", "ES256"]), "typ": "JWT"}
    if r.random() < 0.6:
        header["kid"] = r.randbytes(8).hex()
    claims = {
        "iss": r.choice(
            [
                "https://kubernetes.default.svc.cluster.local",
                "https://accounts.acme-corp.io",
                "https://sts.windows.net/" + r.randbytes(4).hex(),
            ]
        ),
        "sub": r.choice(["system:serviceaccount:prod:builder", "user_" + r.randbytes(6).hex()]),
        "iat": r.randint(1_600_000_000, 1_800_000_000),
        "exp": r.randint(1_800_000_000, 1_900_000_000),
        "jti": r.randbytes(12).hex(),
    }
    sig_len = 32 if header["alg"] == "HS256" else (64 if header["alg"] == "ES256" else 256)
    return ".".join(
        [
            _b64url(json.dumps(header, separators=(",", ":")).encode()),
            _b64url(json.dumps(claims, separators=(",", ":")).encode()),
            _b64url(r.randbytes(sig_len)),
        ]
    )


def _basic(r: random.Random) -> str:
    user = "".join(r.choice(LOWER_ALNUM) for _ in range(r.randint(4, 10)))
    pw = "".join(r.choice(PW) for _ in range(r.randint(12, 24)))
    return base64.b64encode(f"{user}:{pw}".encode()).decode()


def _fp_jwt(header: dict[str, str], claims: dict[str, object], sig: str) -> str:
    return ".".join([_b64url(json.dumps(header).encode()), _b64url(json.dumps(claims).encode()), sig])


def _noise(alphabet: str, n: int, salt: str) -> str:
    """Deterministic filler for hand-written near-misses."""
    digest = hashlib.sha256(f"{alphabet}|{n}|{salt}".encode()).digest()
    r = random.Random(digest)  # noqa: S311 - deterministic test data
    return "".join(r.choice(alphabet) for _ in range(n))


def _snowflake_b64(r: random.Random) -> str:
    """The first segment of a Discord bot token: base64 of the bot's 17-20 digit user id
    (a snowflake: milliseconds since 2015 shifted left by 22 bits, plus worker bits)."""
    ms = r.randint(0, 10 * 365 * 86_400_000)  # created 2015-2025
    snowflake = (ms << 22) | r.getrandbits(22)
    return _b64url(str(max(snowflake, 10**16 + r.getrandbits(20))).encode())


@functools.cache
def _rule(rule_id: str) -> _catalogue.Rule:
    return {r.id: r for r in _catalogue.load_catalogue().rules}[rule_id]


def _passes(rule_id: str) -> Callable[[str], bool]:
    """``keep`` filter: the whole sample passes the rule's entropy floor and validators."""

    def keep(sample: str) -> bool:
        rule, data = _rule(rule_id), sample.encode()
        if rule.min_entropy is not None and _catalogue.shannon_entropy(data) < rule.min_entropy:
            return False
        return all(_catalogue.VALIDATORS[v](data) for v in rule.validators)

    return keep


def _user(lo: int = 4, hi: int = 10) -> R:
    return R(string.ascii_lowercase, lo, hi)


HOSTS = (
    "db.internal",
    "10.0.3.7",
    "pg-primary.prod.svc",
    "cluster0.a1b2c.mongodb.net",
    "[::1]",
    "queue.acme.io",
)
PW_RUN = R(PW, 14, 32, pat=(6, 128))


def _uri(
    schemes: tuple[str, ...],
    user: Part | None = None,
    tail: tuple[str, ...] = ("/app", ":5432/prod", ""),
) -> list[Part]:
    return [schemes, user if user is not None else _user(), ":", PW_RUN, "@", HOSTS, tail]


URI_AUTO = ("short", "long", "badchar", "flat")
KW_AUTO = ("short", "long", "badchar", "flat")
PEM_AUTO: tuple[str, ...] = ()


def _pem_fps(head: str) -> tuple[str, ...]:
    return (
        f"-----BEGIN {head}-----\n...\n-----END {head}-----",
        f"-----BEGIN {head}-----\n" + "A" * 64 + "\n" + "A" * 64 + f"\n-----END {head}-----",
        f"-----BEGIN {head}-----\n<your key here>\n-----END {head}-----",
        f"-----BEGIN {head.replace('PRIVATE', 'PUBLIC')}-----\n"
        + _noise(B64, 64, head)
        + f"\n-----END {head.replace('PRIVATE', 'PUBLIC')}-----",
        "-----BEGIN CERTIFICATE-----\n" + _noise(B64, 64, "cert" + head) + "\n-----END CERTIFICATE-----",
        f"-----BEGIN {head}-----\nMIIEowIBAAKCAQEA" + "/" * 40,
    )


# ---------------------------------------------------------------------------- the specs

S = Spec
SPECS: dict[str, Spec] = {
    # cloud providers
    "aws-access-key-id": S(
        [("AKIA", "ASIA", "ABIA", "ACCA"), R(UPPER_ALNUM, 16)],
        fps=(
            "AKIAIOSFODNN7EXAMPLE",
            "AKIAI44QH8DHBEXAMPLE",
            "akia" + _noise(LOWER_ALNUM, 16, "aws"),
            "AKIA_" + _noise(UPPER_ALNUM, 16, "aws2"),
        ),
    ),
    "aws-secret-access-key": S(
        A(
            (
                "AWS_SECRET_ACCESS_KEY",
                "aws_secret_access_key",
                "SecretAccessKey",
                "aws_secret_key",
                "AWS_SECRET_KEY",
                "secret_access_key",
            ),
            (R(B64, 40),),
        ),
        auto=KW_AUTO,
        fps=(
            'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
            "AWS_SECRET_ACCESS_KEY=je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
            "AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}",
            'secret = os.environ["AWS_SECRET_ACCESS_KEY"]',
            "aws_secret_access_key: " + _noise(B64, 40, "aws") + "ZZ",
        ),
    ),
    "aws-session-token": S(
        [("IQoJb3JpZ2lu", "FwoGZXIvYXdz"), R(B64, 200, 600, pat=(100, 1500)), ("", "=", "==")],
        fps=(
            "IQoJb3JpZ2luX2VjE...",
            "FwoGZXIvYXdzE" + "A" * 200,
            "xIQoJb3JpZ2lu" + _noise(B64, 300, "sess"),
        ),
    ),
    "gcp-service-account-key-id": S(
        A(("private_key_id",), (R(HEX, 40),), styles=('"{n}": "{v}"', "{n}: {v}", "{n}={v}")),
        auto=KW_AUTO,
        fps=(
            '"private_key_id": "' + "0" * 40 + '"',
            '"private_key_id": "<key id>"',
            '"key_id": "' + _noise(HEX, 40, "gcp") + '"',
        ),
    ),
    "gcp-service-account-private-key": S(
        F(_gcp_private_key),
        auto=(),
        fps=(
            '"private_key": "-----BEGIN PRIVATE KEY-----\\n...\\n-----END PRIVATE KEY-----\\n"',
            '"private_key": ""',
            '"private_key": "-----BEGIN PRIVATE KEY-----\\n' + "A" * 64 + '\\n"',
            '"private_key_id": "-----BEGIN PRIVATE KEY-----\\n' + _noise(B64, 64, "g") + '"',
        ),
    ),
    "google-api-key": S(
        ["AIza", R(B64URL, 35)],
        fps=(
            "AIzaSy" + "X" * 33,
            "AIza" + _noise(B64URL, 20, "g"),
            "aiza" + _noise(B64URL, 35, "g2"),
        ),
    ),
    "google-oauth-client-secret": S(["GOCSPX-", R(B64URL, 28)]),
    "google-oauth-access-token": S(
        ["ya29.", R(B64URL, 100, 200, pat=(30, 1500))],
        fps=("ya29.", "ya29.a0Af...", "ya29." + "x" * 60),
    ),
    "google-oauth-refresh-token": S(
        ["1//0", R(B64URL, 60, 100, pat=(40, 400))],
        fps=("1//0" + "g" * 60, "http://10.0.0.1//0/x", "a1//0" + _noise(B64URL, 60, "rt")),
    ),
    "firebase-fcm-server-key": S(["AAAA", R(B64URL, 7), ":APA91b", R(B64URL, 134, pat=(130, 140))]),
    "azure-storage-account-key": S(
        [
            ("DefaultEndpointsProtocol=https;AccountName=acct01;", ""),
            "AccountKey=",
            R(B64, 86),
            "==",
            (";EndpointSuffix=core.windows.net", ""),
        ],
        auto=KW_AUTO,
        fps=(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqF"
            "lqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;",
            "AccountKey=${STORAGE_KEY};",
            "AccountKey=<storage-account-key>;",
        ),
    ),
    "azure-shared-access-key": S(
        [
            "Endpoint=sb://ns1.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;",
            "SharedAccessKey=",
            R(B64, 43),
            "=",
        ],
        auto=KW_AUTO,
        fps=("SharedAccessKey=<key>", "SharedAccessKeyName=RootManageSharedAccessKey;"),
    ),
    "azure-sas-token": S(
        [
            "https://acct.blob.core.windows.net/c/f.txt?sv=",
            ("2021-06-08", "2022-11-02", "2020-08-04"),
            "&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&st=2024-01-01T00:00:00Z&spr=https&sig=",
            R(ALNUM, 43, 60, pat=(40, 120)),
            ("", "%3D"),
        ],
        auto=KW_AUTO,
        fps=(
            "?sv=2021-06-08&ss=b&sig=<signature>",
            "?sv=2021-06-08&sig=",
            "?sp=r&sig=" + _noise(ALNUM, 43, "sas"),
        ),
    ),
    "azure-ad-client-secret": S(
        [R(ALNUM, 3), R(DIGITS, 1), "Q~", R(ALNUM + "_~.-", 34, pat=(31, 34))],
        fps=("abc8Q~", "Q~" + _noise(ALNUM, 36, "aad"), "abcdQ~" + _noise(ALNUM, 34, "aad2")),
    ),
    "alibaba-access-key-id": S(["LTAI", R(ALNUM, 20, pat=(12, 20))]),
    "tencent-secret-id": S(["AKID", R(ALNUM, 32)]),
    "ibm-cloud-api-key": S(
        A(("IBM_CLOUD_API_KEY", "ibmcloud_api_key", "IBM_API_KEY", "ibm-apikey"), (R(B64URL, 44),)),
        auto=KW_AUTO,
        fps=(
            "IBMCLOUD_API_KEY=${IBM_KEY}",
            "IBM_CLOUD_REGION=us-south",
            "fibm_key=" + _noise(B64URL, 44, "ibm2"),
        ),
    ),
    "yandex-api-key": S(["AQVN", R(B64URL, 36, pat=(35, 38))]),
    "yandex-oauth-token": S(["y0_", R(B64URL, 55)]),
    "digitalocean-pat": S(["dop_v1_", R(HEX, 64)]),
    "digitalocean-oauth-token": S(["doo_v1_", R(HEX, 64)]),
    "digitalocean-refresh-token": S(["dor_v1_", R(HEX, 64)]),
    "heroku-api-key": S(
        A(("HEROKU_API_KEY", "heroku_api_key", "HEROKU_API_TOKEN"), tuple(UUID)),
        auto=KW_AUTO,
        fps=(
            "HEROKU_API_KEY=00000000-0000-0000-0000-000000000000",
            "APP_ID=" + "-".join(_noise(HEX, n, "h") for n in (8, 4, 4, 4, 12)),
            "HEROKU_API_KEY=$HEROKU_API_KEY",
        ),
    ),
    "heroku-api-key-v2": S(["HRKU-AA", R(B64URL, 58)]),
    "cloudflare-api-token": S(
        A(("CLOUDFLARE_API_TOKEN", "CF_API_TOKEN", "cloudflare_token"), (R(B64URL, 40),)),
        auto=KW_AUTO,
        fps=(
            "CF_ZONE_ID=" + _noise(B64URL, 40, "cf"),
            "CLOUDFLARE_API_TOKEN=${{ secrets.CF_TOKEN }}",
            "cloudflare_token: " + "x" * 40,
        ),
    ),
    "cloudflare-global-api-key": S(
        A(
            ("CLOUDFLARE_API_KEY", "CF_API_KEY", "X-Auth-Key", "CLOUDFLARE_GLOBAL_API_KEY"),
            (R(HEX, 37),),
        ),
        auto=KW_AUTO,
        fps=("CF_API_KEY=" + _noise(HEX, 32, "cfk"), "X-Auth-Email: ops@acme.io"),
    ),
    "cloudflare-origin-ca-key": S(["v1.0-", R(HEX, 24), "-", R(HEX, 146)]),
    # source hosting / CI
    "github-pat": S(
        ["ghp_", R(ALNUM, 36)],
        fps=(
            "ghp_" + "x" * 36,
            "ghp_1234567890abcdefghijklmnopqrstuvwxyz",
            "ghp-" + _noise(ALNUM, 36, "gh"),
            "myghp_" + _noise(ALNUM, 36, "gh2"),
        ),
    ),
    "github-oauth-token": S(["gho_", R(ALNUM, 36)]),
    "github-user-to-server-token": S(["ghu_", R(ALNUM, 36)]),
    "github-server-to-server-token": S(["ghs_", R(ALNUM, 36)]),
    "github-refresh-token": S(["ghr_", R(ALNUM, 36, 76)]),
    "github-fine-grained-pat": S(
        ["github_pat_", R(ALNUM, 22), "_", R(ALNUM, 59)],
        auto=("short", "long", "flat", "embedded"),
        fps=("github_pat_" + "X" * 82, "github_pat_<token>"),
    ),
    "gitlab-pat": S(
        ["glpat-", R(B64URL, 20, 26, pat=(20, 300))],
        fps=(
            "glpat-xxxxxxxxxxxxxxxxxxxx",
            "glpat-${GITLAB_TOKEN}",
            "glpat-" + _noise(B64URL, 12, "gl"),
        ),
    ),
    "gitlab-deploy-token": S(["gldt-", R(B64URL, 20, 30, pat=(20, 64))]),
    "gitlab-runner-token": S(["glrt-", R(B64URL, 20, 30, pat=(20, 64))]),
    "gitlab-feed-token": S(["glft-", R(B64URL, 20)]),
    "gitlab-incoming-mail-token": S(["glimt-", R(B64URL, 25)]),
    "gitlab-oauth-app-secret": S(["gloas-", R(B64URL, 64)]),
    "gitlab-kubernetes-agent-token": S(["glagent-", R(B64URL, 50)]),
    "gitlab-scim-token": S(["glsoat-", R(B64URL, 20)]),
    "gitlab-feature-flag-client-token": S(["glffct-", R(B64URL, 20)]),
    "gitlab-pipeline-trigger-token": S(["glptt-", R(HEX, 40)]),
    "gitlab-runner-registration-token": S(["GR1348941", R(B64URL, 20)]),
    "gitlab-cicd-job-token": S(["glcbt-", R(ALNUM, 1, 5), "_", R(B64URL, 20)]),
    "bitbucket-app-password": S(["ATBB", R(ALNUM, 32)]),
    "atlassian-api-token": S(["ATATT3xFfGF0", R(B64URL + "=", 170, 185, pat=(144, 244))]),
    "sourcegraph-access-token": S(["sgp_", (R(HEX, 16), "local"), "_", R(HEX, 40)]),
    "buildkite-user-token": S(["bkua_", R(HEX, 40)]),
    "circleci-pat": S(["CCIPAT_", R(ALNUM, 22), "_", R(HEX, 40)]),
    "harness-access-token": S([("pat.", "sat."), R(B64URL, 22), ".", R(ALNUM, 24), ".", R(ALNUM, 20)]),
    "octopus-deploy-api-key": S(
        ["API-", R(UPPER_ALNUM, 26)],
        fps=(
            "API-GATEWAY-DEPLOYMENT-STAGE-PROD",
            "API-" + "A" * 26,
            "XAPI-" + _noise(UPPER_ALNUM, 26, "oct"),
        ),
    ),
    "terraform-cloud-token": S([R(ALNUM, 14), ".atlasv1.", R(B64URL + "=", 67, pat=(60, 70))]),
    "pulumi-access-token": S(["pul-", R(HEX, 40)]),
    "vault-service-token": S(["hvs.", R(B64URL, 95, pat=(90, 120))]),
    "vault-batch-token": S(["hvb.", R(B64URL, 150, 200, pat=(138, 300))]),
    "doppler-personal-token": S(["dp.pt.", R(ALNUM, 43)]),
    "doppler-service-token": S(["dp.st.", ("", "prd.", "dev_config."), R(ALNUM, 40, 44)]),
    "doppler-cli-token": S(["dp.ct.", R(ALNUM, 40, 44)]),
    "doppler-service-account-token": S(["dp.sa.", R(ALNUM, 40, 44)]),
    "onepassword-service-account-token": S(["ops_eyJ", R(B64, 300, 500, pat=(250, 1500)), ("", "=", "==")]),
    "onepassword-secret-key": S(
        [
            "A3-",
            R(UPPER_ALNUM, 6),
            "-",
            R(UPPER_ALNUM, 11),
            "-",
            R(UPPER_ALNUM, 5),
            "-",
            R(UPPER_ALNUM, 5),
            "-",
            R(UPPER_ALNUM, 5),
        ]
    ),
    "age-secret-key": S(
        ["AGE-SECRET-KEY-1", R(BECH32, 58)],
        fps=(
            "AGE-SECRET-KEY-1" + "Q" * 58,
            "age1" + _noise(BECH32.lower(), 58, "a"),
            "AGE-SECRET-KEY-1" + _noise(BECH32, 50, "a2"),
        ),
    ),
    "tailscale-key": S(
        [
            "tskey-",
            ("auth", "api", "client"),
            "-",
            R(ALNUM, 12, pat=(8, 20)),
            "-",
            R(ALNUM, 30, pat=(20, 40)),
        ]
    ),
    "defined-networking-api-token": S(["dnkey-", R(LOWER_ALNUM + "=_-", 26), "-", R(LOWER_ALNUM + "=_-", 52)]),
    "openshift-user-token": S(["sha256~", R(B64URL, 43)]),
    # hosting / PaaS / data
    "flyio-access-token": S(["fo1_", R(B64URL, 43)]),
    "flyio-macaroon-token": S(
        [
            ("fm2_", "FlyV1 fm2_", "FlyV1 fm1r_", "fm1a_"),
            R(B64, 200, 400, pat=(100, 1500)),
            ("", "=", "=="),
        ]
    ),
    "vercel-token": S(
        A(("VERCEL_TOKEN", "vercel_api_token", "VERCEL_ACCESS_TOKEN"), (R(ALNUM, 24),)),
        auto=KW_AUTO,
        fps=(
            "VERCEL_TOKEN=${{ secrets.VERCEL_TOKEN }}",
            "VERCEL_ORG_ID=team_" + _noise(ALNUM, 24, "v"),
        ),
    ),
    "netlify-token": S(
        A(
            ("NETLIFY_AUTH_TOKEN", "netlify_token", "NETLIFY_API_TOKEN"),
            (R(B64URL, 43, pat=(40, 46)),),
        ),
        auto=KW_AUTO,
    ),
    "supabase-pat": S(["sbp_", R(HEX, 40)]),
    "supabase-secret-key": S(["sb_secret_", R(B64URL, 31, pat=(20, 64))]),
    "planetscale-token": S(["pscale_tkn_", R(B64URL + ".=", 43, pat=(32, 64))]),
    "planetscale-password": S(["pscale_pw_", R(B64URL + ".=", 43, pat=(32, 64))]),
    "planetscale-oauth-token": S(["pscale_oauth_", R(B64URL + ".=", 43, pat=(32, 64))]),
    "databricks-token": S(["dapi", R(HEX, 32), ("", "-2")]),
    "neon-api-key": S(["napi_", R(LOWER_ALNUM, 64)]),
    "prefect-api-key": S(["pnu_", R(ALNUM, 36)]),
    "scalingo-api-token": S(["tk-us-", R(B64URL, 48)]),
    "dropbox-access-token": S(
        ["sl.", ("", "u."), R(B64URL + "=", 150, 300, pat=(130, 1400))],
        fps=("sl." + "A" * 140, "see sl.no 4", "sl.u." + "ab" * 70),
    ),
    "jfrog-api-key": S(["AKCp", R(ALNUM, 69)]),
    "jfrog-reference-token": S(["cmVmdGtu", R(ALNUM, 56)]),
    "ngrok-authtoken": S(
        A(
            ("NGROK_AUTHTOKEN", "ngrok_api_key", "NGROK_TOKEN"),
            (R(ALNUM, 27, pat=(20, 30)), "_", R(ALNUM, 21, pat=(17, 25))),
        ),
        auto=KW_AUTO,
        fps=("NGROK_AUTHTOKEN=<your authtoken>", "ngrok_region=eu"),
    ),
    # packages / registries
    "npm-access-token": S(["npm_", R(ALNUM, 36)]),
    "npmrc-auth-token": S(
        [
            ("//registry.npmjs.org/:", "//npm.pkg.github.com/:", ""),
            "_authToken=",
            R(B64URL, 40, pat=(20, 200)),
        ],
        auto=KW_AUTO,
        fps=("//registry.npmjs.org/:_authToken=${NPM_TOKEN}", "_authToken=" + "0" * 36),
    ),
    "pypi-upload-token": S(
        [
            ("pypi-AgEIcHlwaS5vcmc", "pypi-AgENdGVzdC5weXBpLm9yZw"),
            R(B64URL, 150, 200, pat=(50, 1000)),
        ]
    ),
    "rubygems-api-key": S(["rubygems_", R(HEX, 48)]),
    "nuget-api-key": S(["oy2", R(LOWER_ALNUM, 43)]),
    "dockerhub-pat": S([("dckr_pat_", "dckr_oat_"), R(B64URL, 27, pat=(27, 40))]),
    "clojars-api-token": S(["CLOJARS_", R(LOWER_ALNUM, 60)]),
    "readme-api-key": S(["rdme_", R(LOWER_ALNUM, 70)]),
    "infracost-api-token": S(
        ["ico-", R(ALNUM, 32)],
        fps=(
            "favicon-" + _noise(ALNUM, 32, "ico"),
            "ico-" + "a" * 32,
            "ico-" + _noise(ALNUM, 31, "ico2"),
        ),
    ),
    # chat / comms
    "slack-bot-token": S(
        [
            "xoxb-",
            R(DIGITS, 12, pat=(8, 14)),
            "-",
            R(DIGITS, 13, pat=(10, 13)),
            "-",
            R(ALNUM, 24, pat=(18, 34)),
        ],
        fps=(
            "xoxb-XXXXXXXXXXXX-XXXXXXXXXXXXX-XXXXXXXXXXXXXXXXXXXXXXXX",
            "xoxb-your-bot-token",
            "xoxb-123",
        ),
    ),
    "slack-user-token": S(
        [
            ("xoxp-", "xoxe-"),
            R(DIGITS, 12, pat=(10, 13)),
            "-",
            R(DIGITS, 12, pat=(10, 13)),
            "-",
            R(DIGITS, 12, pat=(10, 13)),
            "-",
            R(HEX, 32, pat=(28, 34)),
        ]
    ),
    "slack-app-token": S(
        [
            "xapp-",
            R(DIGITS, 1),
            "-",
            R(UPPER_ALNUM, 11, pat=(9, 12)),
            "-",
            R(DIGITS, 13, pat=(10, 13)),
            "-",
            R(HEX, 64),
        ]
    ),
    "slack-workspace-token": S([("xoxa-", "xoxr-"), R(ALNUM, 40, 60, pat=(20, 160))]),
    "slack-legacy-token": S(
        [
            ("xoxs-", "xoxo-"),
            R(DIGITS, 10, pat=(1, 13)),
            "-",
            R(DIGITS, 10, pat=(1, 13)),
            "-",
            R(DIGITS, 10, pat=(1, 13)),
            "-",
            R(HEX, 64, pat=(20, 64)),
        ]
    ),
    "slack-config-token": S([("xoxe.xoxp-1-", "xoxe.xoxb-1-", "xoxe-1-"), R(UPPER_ALNUM, 146, 166, pat=(140, 170))]),
    "slack-webhook-url": S(
        [
            "https://hooks.slack.com/services/T",
            R(UPPER_ALNUM, 10, pat=(8, 12)),
            "/B",
            R(UPPER_ALNUM, 10, pat=(8, 12)),
            "/",
            R(ALNUM, 24, pat=(23, 25)),
        ],
        auto=KW_AUTO,
        fps=(
            "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
            "https://hooks.slack.com/services/${SLACK_WEBHOOK_PATH}",
            "https://hooks.slack.com/",
        ),
    ),
    "slack-workflow-webhook-url": S(
        [
            "https://hooks.slack.com/",
            ("workflows", "triggers"),
            "/T",
            R(UPPER_ALNUM, 10, pat=(8, 12)),
            "/A",
            R(UPPER_ALNUM, 10, pat=(8, 12)),
            "/",
            R(DIGITS, 18, pat=(17, 19)),
            "/",
            R(ALNUM, 32),
        ],
        auto=KW_AUTO,
    ),
    "discord-bot-token": S(
        (
            A(
                ("DISCORD_BOT_TOKEN", "discord_token", "DISCORD_TOKEN"),
                (
                    F(_snowflake_b64),
                    ".",
                    R(B64URL, 6),
                    ".",
                    R(B64URL, 38, pat=(27, 38)),
                ),
            ),
            [
                "Authorization: Bot ",
                F(_snowflake_b64),
                ".",
                R(B64URL, 6),
                ".",
                R(B64URL, 38, pat=(27, 38)),
            ],
        ),
        auto=KW_AUTO,
        fps=(
            "DISCORD_TOKEN=" + "M" + _noise(B64URL, 23, "d1") + "." + _noise(B64URL, 6, "d2"),
            "robot " + "N" + _noise(B64URL, 25, "d3") + "." + _noise(B64URL, 6, "d4") + "." + _noise(B64URL, 38, "d5"),
            "DISCORD_TOKEN=${DISCORD_TOKEN}",
        ),
    ),
    "discord-webhook-url": S(
        [
            "https://",
            ("discord.com", "discordapp.com"),
            "/api/webhooks/",
            R(DIGITS, 18, pat=(17, 20)),
            "/",
            R(B64URL, 68, pat=(60, 68)),
        ],
        auto=KW_AUTO,
        fps=(
            "https://discord.com/api/webhooks/{id}/{token}",
            "https://discord.com/api/webhooks/123/abc",
        ),
    ),
    "msteams-webhook-url": S(
        [
            "https://",
            R(string.ascii_lowercase, 8),
            ".webhook.office.com/webhookb2/",
            *UUID,
            "@",
            *UUID,
            "/IncomingWebhook/",
            R(HEX, 32),
            "/",
            *UUID,
        ],
        auto=("flat",),
        fps=(
            "https://acme.webhook.office.com/webhookb2/<id>@<tenant>/IncomingWebhook/<secret>/<id>",
            "https://outlook.office.com/webhook/",
            "https://acme.webhook.office.com/webhookb2/",
        ),
    ),
    "telegram-bot-token": S(
        [("", "https://api.telegram.org/bot"), R(DIGITS, 10, pat=(8, 10)), ":AA", R(B64URL, 33)],
        fps=(
            "123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11",
            "110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsa",
            "12:AA" + _noise(B64URL, 33, "tg"),
        ),
    ),
    "twilio-api-key": S(["SK", R(HEX, 32)]),
    "twilio-account-credentials": S(["AC", R(HEX, 32), ":", R(HEX, 32)]),
    "twilio-auth-token": S(
        A(("TWILIO_AUTH_TOKEN", "twilio_auth_token", "TWILIO_TOKEN"), (R(HEX, 32),)),
        auto=KW_AUTO,
        fps=("TWILIO_AUTH_TOKEN=your_auth_token", "TWILIO_ACCOUNT_SID=AC" + "0" * 32),
    ),
    "sendgrid-api-key": S(
        ["SG.", R(B64URL, 22), ".", R(B64URL, 43)],
        fps=(
            "SG.xxxxxxxxxxxxxxxxxxxxxx.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "SG." + _noise(B64URL, 22, "sg"),
            "XSG." + _noise(B64URL, 22, "sg2") + "." + _noise(B64URL, 43, "sg3"),
        ),
    ),
    "mailgun-api-key": S(
        ["key-", R(HEX, 32)],
        fps=(
            "cache-key-" + _noise(HEX, 32, "mg"),
            "api-key-" + _noise(HEX, 32, "mg2"),
            "key-" + "0" * 32,
        ),
    ),
    "mailchimp-api-key": S([R(HEX, 32), "-us", R(DIGITS, 2, pat=(1, 2))]),
    "postmark-server-token": S(
        A(
            (
                "POSTMARK_SERVER_TOKEN",
                "postmark_api_token",
                "X-Postmark-Server-Token",
                "POSTMARK_API_KEY",
            ),
            tuple(UUID),
        ),
        auto=KW_AUTO,
        fps=("X-Postmark-Server-Token: POSTMARK_API_TEST",),
    ),
    "brevo-api-key": S([("xkeysib-", "xsmtpsib-"), R(HEX, 64), "-", R(ALNUM, 16)]),
    "resend-api-key": S(
        ["re_", R(ALNUM, 8), "_", R(ALNUM, 24)],
        fps=(
            "re_123456789",
            "re_compile_patterns_for_the_module_loader",
            "pre_" + _noise(ALNUM, 8, "rs") + "_" + _noise(ALNUM, 24, "rs2"),
        ),
    ),
    "linear-api-key": S(["lin_api_", R(ALNUM, 40)]),
    "notion-integration-token": S(
        ["secret_", R(ALNUM, 43)],
        fps=("secret_key_base", "client_secret_" + _noise(ALNUM, 43, "n"), "secret_" + "x" * 43),
    ),
    "notion-api-token": S(["ntn_", R(DIGITS, 11), R(ALNUM, 35)]),
    "asana-pat": S(
        [("2/", "1/", "0/"), R(DIGITS, 16), ("", ["/", R(DIGITS, 16)]), ":", R(ALNUM, 32)],
        fps=(
            "1/1/2024",
            "2/" + "0" * 16 + ":" + "a" * 32,
            "12/" + _noise(DIGITS, 16, "as") + ":" + _noise(ALNUM, 32, "as2"),
        ),
    ),
    "airtable-pat": S(["pat", R(ALNUM, 14), ".", R(HEX, 64)]),
    "figma-pat": S(["figd_", R(B64URL, 40)]),
    "postman-api-key": S(["PMAK-", R(HEX, 24), "-", R(HEX, 34)]),
    "hubspot-private-app-token": S(["pat-", ("na1", "eu1"), "-", *UUID]),
    "contentful-pat": S(["CFPAT-", R(B64URL, 43)]),
    "typeform-pat": S(["tfp_", R(B64URL + ".=", 59)]),
    "frameio-api-token": S(["fio-u-", R(B64URL + "=", 64)]),
    "beamer-api-token": S(A(("BEAMER_API_KEY", "beamer_token"), ("b_", R(B64URL + "=", 44))), auto=KW_AUTO),
    "launchdarkly-access-token": S(
        [("api-", "sdk-"), *UUID],
        fps=(
            "my-api-" + "-".join(_noise(HEX, n, "ld") for n in (8, 4, 4, 4, 12)),
            "api-00000000-0000-0000-0000-000000000000",
            "mob-" + "-".join(_noise(HEX, n, "ld2") for n in (8, 4, 4, 4, 12)),
        ),
    ),
    "adafruit-io-key": S(["aio_", R(ALNUM, 28)]),
    # payments / commerce
    "stripe-live-secret-key": S(
        ["sk_live_", R(ALNUM, 24, 99, pat=(24, 247))],
        fps=(
            "sk_live_XXXXXXXXXXXXXXXXXXXXXXXX",
            "mysk_live_" + _noise(ALNUM, 24, "s"),
            "sk_live_...",
            "pk_live_" + _noise(ALNUM, 24, "s2"),
        ),
    ),
    "stripe-live-restricted-key": S(["rk_live_", R(ALNUM, 24, 99, pat=(24, 247))]),
    "stripe-test-secret-key": S(
        [("sk_test_", "rk_test_"), R(ALNUM, 24, 99, pat=(24, 247))],
        fps=(
            "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
            "sk_test_BQokikJOvBiI2HlWgH4olfQ2",
            "pk_test_" + _noise(ALNUM, 24, "st"),
        ),
    ),
    "stripe-webhook-secret": S(
        ["whsec_", R(ALNUM, 32, pat=(32, 88))],
        fps=("whsec_...", "whsec_" + "X" * 32, "whsec_${WEBHOOK_SECRET}"),
    ),
    "square-access-token": S((["EAAA", R(B64URL, 60)], ["sq0atp-", R(B64URL, 22)])),
    "square-oauth-secret": S(["sq0csp-", R(B64URL, 43)]),
    "braintree-access-token": S(
        ["access_token$", ("production", "sandbox"), "$", R(LOWER_ALNUM, 16), "$", R(HEX, 32)],
        auto=("short", "long", "badchar", "embedded"),
        fps=(
            "access_token$production$<merchant>$<token>",
            "access_token=" + _noise(HEX, 32, "bt"),
            "access_token$production$" + "a" * 16 + "$" + "0" * 32,
        ),
    ),
    "plaid-access-token": S(["access-", ("sandbox", "production", "development"), "-", *UUID]),
    "flutterwave-secret-key": S(["FLWSECK", ("_TEST", ""), "-", R("abcdefgh0123456789", 32), "-X"]),
    "duffel-api-token": S(["duffel_", ("test", "live"), "_", R(B64URL + "=", 43)]),
    "shippo-api-token": S(["shippo_", ("live", "test"), "_", R(HEX, 40)]),
    "easypost-api-key": S([("EZAK", "EZTK"), R(ALNUM, 54)]),
    "lob-api-key": S(
        [("live_", "test_"), R(HEX, 35)],
        fps=(
            "test_" + _noise(HEX, 32, "lob"),
            "my_test_" + _noise(HEX, 35, "lob2"),
            "live_" + "0" * 35,
        ),
    ),
    "shopify-access-token": S(["shpat_", R(HEX, 32)]),
    "shopify-shared-secret": S(["shpss_", R(HEX, 32)]),
    "shopify-custom-app-token": S(["shpca_", R(HEX, 32)]),
    "shopify-private-app-token": S(["shppa_", R(HEX, 32)]),
    # AI providers
    "openai-api-key-legacy": S(
        ["sk-", R(ALNUM, 20), "T3BlbkFJ", R(ALNUM, 20)],
        fps=("sk-" + "x" * 48, "sk-...T3BlbkFJ...", "sk-" + _noise(ALNUM, 48, "oai")),
    ),
    "openai-project-key": S(
        ["sk-proj-", R(B64URL, 100, 160, pat=(40, 250))],
        fps=(
            "sk-proj-...",
            "sk-proj-your-api-key-here-0123456789abcdefghijklmn",
            "sk-proj-" + "x" * 48,
            "sk-" + _noise(ALNUM, 48, "oai2"),
        ),
    ),
    "openai-service-account-key": S(["sk-svcacct-", R(B64URL, 100, 160, pat=(40, 250))]),
    "openai-admin-key": S(["sk-admin-", R(B64URL, 100, 160, pat=(40, 250))]),
    "openai-unscoped-key": S(["sk-None-", R(B64URL, 100, 160, pat=(40, 250))]),
    "anthropic-api-key": S(
        ["sk-ant-api03-", R(B64URL, 93), "AA"],
        fps=(
            "sk-ant-api03-...",
            "sk-ant-api03-" + "x" * 93 + "AA",
            "sk-ant-api03-" + _noise(B64URL, 93, "ant") + "BB",
        ),
    ),
    "anthropic-admin-key": S(["sk-ant-admin01-", R(B64URL, 93), "AA"]),
    "huggingface-access-token": S(
        ["hf_", R(LETTERS, 34)],
        fps=(
            "hf_" + _noise(ALNUM, 34, "hf"),
            "hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "use_hf_" + _noise(LETTERS, 34, "hf2"),
        ),
    ),
    "huggingface-org-token": S(["api_org_", R(LETTERS, 34)]),
    "groq-api-key": S(["gsk_", R(ALNUM, 52)]),
    "replicate-api-token": S(["r8_", R(ALNUM, 37)]),
    "perplexity-api-key": S(["pplx-", R(ALNUM, 48)]),
    "xai-api-key": S(["xai-", R(ALNUM, 80)]),
    "openrouter-api-key": S(["sk-or-v1-", R(HEX, 64)]),
    "langsmith-api-key": S(["lsv2_", ("pt", "sk"), "_", R(HEX, 32), "_", R(HEX, 10)]),
    "langfuse-secret-key": S(
        ["sk-lf-", *UUID],
        fps=(
            "pk-lf-" + "-".join(_noise(HEX, n, "lf") for n in (8, 4, 4, 4, 12)),
            "sk-lf-...",
            "sk-lf-00000000-0000-0000-0000-000000000000",
        ),
    ),
    "pinecone-api-key": S(["pcsk_", R(ALNUM, 5, pat=(4, 8)), "_", R(ALNUM, 64, pat=(50, 80))]),
    "tavily-api-key": S(["tvly-", ("", "dev-", "prod-"), R(ALNUM, 32)]),
    "cohere-api-key": S(
        A(("COHERE_API_KEY", "CO_API_KEY", "cohere_key"), (R(ALNUM, 40),)),
        auto=KW_AUTO,
        fps=(
            "COHERE_API_KEY=os.getenv('COHERE_API_KEY')",
            "coherent_key=" + _noise(ALNUM, 40, "co"),
        ),
    ),
    "mistral-api-key": S(A(("MISTRAL_API_KEY", "mistral_key"), (R(ALNUM, 32),)), auto=KW_AUTO),
    "wandb-api-key": S(A(("WANDB_API_KEY", "wandb_key"), (R(HEX, 40),)), auto=KW_AUTO),
    # observability / ops
    "datadog-api-key": S(
        A(("DD_API_KEY", "DATADOG_API_KEY", "dd-api-key", "datadog_api_key"), (R(HEX, 32),)),
        auto=KW_AUTO,
        fps=(
            "DD_API_KEY=<DATADOG_API_KEY>",
            "added_api_key=" + _noise(HEX, 32, "dd"),
            "DD_SITE=datadoghq.eu",
        ),
    ),
    "datadog-app-key": S(
        A(
            ("DD_APP_KEY", "DATADOG_APP_KEY", "dd-application-key", "DD_APPLICATION_KEY"),
            (R(HEX, 40),),
        ),
        auto=KW_AUTO,
    ),
    "newrelic-user-api-key": S(["NRAK-", R(UPPER_ALNUM, 27)]),
    "newrelic-insert-key": S([("NRII-", "NRIQ-"), R(B64URL, 32)]),
    "newrelic-license-key": S([R(HEX, 36), "NRAL"]),
    "grafana-cloud-token": S(["glc_", R(B64, 60, 120, pat=(32, 400)), ("", "=", "==")]),
    "grafana-service-account-token": S(["glsa_", R(ALNUM, 32), "_", R(HEX, 8)]),
    "grafana-api-key": S(["eyJrIjoi", R(B64, 80, 120, pat=(70, 400)), ("", "=", "==")]),
    "sentry-org-token": S(["sntrys_eyJ", R(B64 + "_-=", 120, 200, pat=(60, 500))]),
    "sentry-user-token": S(["sntryu_", R(HEX, 64)]),
    "dynatrace-token": S(["dt0c01.", R(UPPER_ALNUM, 24), ".", R(UPPER_ALNUM, 64)]),
    "pagerduty-api-key": S(
        A(("PAGERDUTY_API_KEY", "pagerduty_token", "PAGERDUTY_API_TOKEN"), (R(ALNUM + "_+-", 20),)),
        auto=KW_AUTO,
    ),
    "algolia-admin-key": S(
        A(("ALGOLIA_ADMIN_KEY", "algolia_api_key", "ALGOLIA_WRITE_API_KEY"), (R(HEX, 32),)),
        auto=KW_AUTO,
    ),
    "snyk-api-token": S(A(("SNYK_TOKEN", "snyk_api_token"), tuple(UUID)), auto=KW_AUTO),
    # identity / social
    "okta-api-token": S(
        (
            A(("OKTA_API_TOKEN", "okta_token", "OKTA_CLIENT_TOKEN"), ("00", R(B64URL, 40))),
            ["Authorization: SSWS 00", R(B64URL, 40)],
        ),
        auto=KW_AUTO,
        fps=("Authorization: SSWS ${OKTA_API_TOKEN}", "okta_domain=dev-123456.okta.com"),
    ),
    "twitter-bearer-token": S(["A" * 20, R(ALNUM + "%", 80, 100, pat=(60, 160))]),
    "twitch-api-token": S(A(("TWITCH_OAUTH_TOKEN", "twitch_token"), (R(LOWER_ALNUM, 30),)), auto=KW_AUTO),
    "facebook-access-token": S(
        ["EAA", R(ALNUM, 150, 200, pat=(100, 250))],
        fps=("EAA" + "A" * 120, "EAAG...", "aEAA" + _noise(ALNUM, 150, "fb")),
    ),
    "mapbox-secret-token": S(
        [("sk.eyJ", "tk.eyJ"), R(B64URL, 60, 100, pat=(50, 300)), ".", R(B64URL, 22, pat=(20, 30))],
        fps=(
            "pk.eyJ" + _noise(B64URL, 60, "mb") + "." + _noise(B64URL, 22, "mb2"),
            "sk.eyJ...",
            "sk.eyJ" + "A" * 60 + "." + "A" * 22,
        ),
    ),
    # private keys
    "private-key-rsa": S(
        (
            _pem("RSA PRIVATE KEY", b"\x30\x82\x04\xa4\x02\x01\x00\x02\x82\x01\x01\x00"),
            _pem(
                "RSA PRIVATE KEY",
                b"\x30\x82\x04\xa4",
                "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,34F09A4FC8DE23D4\n\n",
            ),
        ),
        auto=PEM_AUTO,
        fps=_pem_fps("RSA PRIVATE KEY"),
    ),
    "private-key-dsa": S(
        _pem("DSA PRIVATE KEY", b"\x30\x82\x01\xbb\x02\x01\x00"),
        auto=PEM_AUTO,
        fps=_pem_fps("DSA PRIVATE KEY"),
    ),
    "private-key-ec": S(
        _pem("EC PRIVATE KEY", b"\x30\x77\x02\x01\x01\x04\x20", size=(90, 200)),
        auto=PEM_AUTO,
        fps=_pem_fps("EC PRIVATE KEY"),
    ),
    "private-key-openssh": S(
        _pem("OPENSSH PRIVATE KEY", b"openssh-key-v1\x00\x00\x00\x00\x04none"),
        auto=PEM_AUTO,
        fps=_pem_fps("OPENSSH PRIVATE KEY"),
    ),
    "private-key-pgp": S(F(_pgp), auto=PEM_AUTO, fps=_pem_fps("PGP PRIVATE KEY BLOCK")),
    "private-key-pkcs8": S(
        _pem("PRIVATE KEY", bytes.fromhex("308204bd020100300d06092a864886f70d01010105")),
        auto=PEM_AUTO,
        fps=_pem_fps("PRIVATE KEY"),
    ),
    "private-key-pkcs8-encrypted": S(
        _pem("ENCRYPTED PRIVATE KEY", bytes.fromhex("308205")),
        auto=PEM_AUTO,
        fps=_pem_fps("ENCRYPTED PRIVATE KEY"),
    ),
    "putty-private-key": S(
        F(_putty),
        auto=(),
        fps=(
            "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPrivate-Lines: 14\n...",
            "PuTTY-User-Key-File-3: ssh-ed25519\nPrivate-Lines: 1\n" + "A" * 64,
            "PuTTY-User-Key-File-2: ssh-rsa\nPublic-Lines: 6\n" + _noise(B64, 64, "pp"),
        ),
    ),
    # tokens
    "jwt": S(
        F(_jwt),
        auto=(),
        fps=(
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwi"
            "aWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            _fp_jwt({"alg": "none"}, {"sub": "1234"}, ""),
            _fp_jwt({"alg": "HS256"}, {"sub": "1234"}, "short"),
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0",
            "x" + _fp_jwt({"alg": "HS256"}, {"sub": "abc", "n": 1}, _noise(B64URL, 43, "jwt")),
        ),
    ),
    # connection strings
    "postgres-connection-uri": S(
        _uri(("postgres://", "postgresql://", "postgresql+psycopg://")),
        auto=URI_AUTO,
        fps=(
            "postgres://user:password@localhost/db",
            "postgres://${DB_USER}:${DB_PASS}@db:5432/app",
            "postgresql://postgres:postgres@localhost:5432/postgres",
            "postgres://app@db.internal/app",
            "postgres://:@host/db",
            "postgresql://$PGUSER:$PGPASSWORD@$PGHOST/db",
        ),
    ),
    "mysql-connection-uri": S(
        _uri(("mysql://", "mysql+pymysql://", "mariadb://"), tail=("/app", ":3306/shop")),
        auto=URI_AUTO,
        fps=(
            "mysql://root:root@localhost:3306/test",
            "mysql://root:secret@db/app",
            "mysql://user:<password>@host/db",
        ),
    ),
    "mongodb-connection-uri": S(
        _uri(("mongodb+srv://", "mongodb://"), tail=("/?retryWrites=true", "/app")),
        auto=URI_AUTO,
        fps=(
            "mongodb+srv://<username>:<password>@cluster0.mongodb.net/",
            "mongodb://admin:admin@localhost:27017",
            "mongodb://localhost:27017/app",
        ),
    ),
    "redis-connection-uri": S(
        _uri(("redis://", "rediss://"), user=("", "default"), tail=(":6379/0", "")),
        auto=URI_AUTO,
        fps=(
            "redis://:password@localhost:6379/0",
            "redis://localhost:6379",
            "redis://default:${REDIS_PASSWORD}@cache:6379",
        ),
    ),
    "amqp-connection-uri": S(
        _uri(("amqp://", "amqps://"), tail=(":5672/vhost", "")),
        auto=URI_AUTO,
        fps=(
            "amqp://guest:guest@localhost:5672/",
            "amqp://rabbitmq:rabbitmq@mq/",
            "amqp://user:changeme@mq:5672",
        ),
    ),
    "url-embedded-credentials": S(
        _uri(
            ("https://", "http://", "ftp://", "git+https://", "smtp://"),
            tail=("/org/repo.git", ":8443/api", ""),
        ),
        auto=URI_AUTO,
        fps=(
            "https://user:pass@example.com",
            "https://admin:admin123@localhost/",
            "https://localhost:8080/path?x=1",
            "https://cdn.jsdelivr.net/npm/pkg@1.2.3",
            "https://medium.com/@someone/post",
            "git@github.com:org/repo.git",
            "https://${GIT_USER}:${GIT_TOKEN}@github.com/org/repo",
        ),
    ),
    "jdbc-connection-password": S(
        [
            "jdbc:",
            ("mysql", "postgresql", "sqlserver"),
            "://db.internal:3306/app?user=svc&password=",
            R(PW, 16, 24, pat=(6, 128)),
        ],
        auto=("short", "badchar", "flat"),
        fps=(
            "jdbc:mysql://localhost:3306/db?user=root&password=password",
            "jdbc:postgresql://db/app?user=app&password=${DB_PASSWORD}",
            "jdbc:mysql://localhost/db?password=",
        ),
    ),
    "odbc-connection-password": S(
        [
            "Server=tcp:sql1.database.windows.net,1433;Database=app;",
            ("User ID", "Uid", "User"),
            "=",
            R(string.ascii_lowercase, 5, 10),
            ";",
            ("Password", "Pwd"),
            "=",
            R(PW, 16, 24, pat=(6, 128)),
            ";",
        ],
        auto=("short", "badchar", "flat"),
        fps=(
            "Server=.;Database=app;User Id=sa;Password=<YourStrong@Passw0rd>;",
            "Server=db;User ID=app;Password={password};",
            "Server=db;Integrated Security=true;",
        ),
    ),
    "http-basic-auth-header": S(
        [("Authorization: Basic ", '"Authorization": "Basic ', "authorization: basic "), F(_basic)],
        auto=(),
        fps=(
            "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==",
            "Authorization: Basic dXNlcm5hbWU6cGFzc3dvcmQ=",
            "Authorization: Basic ${BASIC_AUTH}",
            "Authorization: Basic AAAAAAAAAAAA",
            "Authorization: Bearer " + _noise(B64, 40, "ba"),
        ),
    ),
    # bare forms: the value of a name-context rule standing alone (see test_bare_credentials)
    "aws-secret-access-key-bare": S(
        R(B64, 40),
        keep=_passes("aws-secret-access-key-bare"),
        fps=(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            _noise(ALNUM, 40, "aws-bare"),  # no '/' or '+': a random alphanumeric id
            "app/Http/Controllers/Api/V1/UserProfile2",  # a path of words
            "Cache1558/config/v1/Update2090/Models/v1",
            base64.b64encode(hashlib.sha256(b"aws-bare").digest()).decode(),  # 44 chars
            hashlib.sha1(b"aws-bare").hexdigest(),  # a git SHA
            "a" + _noise(B64, 39, "aws-bare2").lower(),  # one class only
        ),
    ),
    "cloudflare-global-api-key-bare": S(
        R(HEX, 37),
        keep=_passes("cloudflare-global-api-key-bare"),
        fps=(
            hashlib.sha1(b"cf").hexdigest(),  # 40 hex: a git SHA
            hashlib.md5(b"cf").hexdigest(),  # noqa: S324 - 32 hex: an MD5
            "0x" + _noise(HEX, 37, "cf-bare"),  # a hex literal
            "1" * 37,  # a number
        ),
    ),
    "discord-bot-token-bare": S(
        [F(_snowflake_b64), ".", R(B64URL, 6), ".", R(B64URL, 38, pat=(27, 38))],
        keep=_passes("discord-bot-token-bare"),
        fps=(
            # the shape, but the first segment is not the base64 of a decimal id
            "M" + _noise(B64URL, 25, "d6") + "." + _noise(B64URL, 6, "d7") + "." + _noise(B64URL, 38, "d8"),
            _b64url(b"12345678901234567x") + "." + _noise(B64URL, 6, "d9") + "." + _noise(B64URL, 38, "d10"),
            _b64url(b"0123456789012345678") + "." + _noise(B64URL, 6, "d11") + "." + _noise(B64URL, 27, "d12"),
        ),
    ),
    "okta-api-token-bare": S(
        ["00", R(B64URL, 40)],
        keep=_passes("okta-api-token-bare"),
        fps=(
            "00" + "0" * 40,
            "00" + _noise(LOWER_ALNUM, 40, "okta"),  # one case only: a zero-padded id
            "0" + _noise(B64URL, 41, "okta2"),
        ),
    ),
    "beamer-api-token-bare": S(
        ["b_", R(B64URL + "=", 44)],
        keep=_passes("beamer-api-token-bare"),
        fps=(
            "b_" + _noise(string.ascii_lowercase + "_", 44, "beamer"),  # an identifier
            "b_" + "user_profile_settings_dashboard_view_v2_x",
            "ab_" + _noise(B64URL, 44, "beamer2"),
        ),
    ),
    # generic (advisory)
    "generic-api-key": S(
        A(
            ("api_key", "API_TOKEN", "client_secret", "SECRET", "auth_token", "access_key"),
            (R(ALNUM + "_-", 32, pat=(20, 128)),),
        ),
        auto=KW_AUTO,
        fps=(
            "api_key = os.environ['API_KEY']",
            "API_TOKEN=${API_TOKEN}",
            "client_secret: your-client-secret-goes-here",
        ),
    ),
    "generic-password": S(
        A(("password", "DB_PASSWORD", "passwd", "pwd"), (R(PW, 14, 24, pat=(8, 64)),)),
        auto=("short", "badchar", "flat"),
        fps=(
            "password = getpass.getpass()",
            "DB_PASSWORD=${DB_PASSWORD}",
            "password: changeme",
            "passwd=hunter2",
        ),
    ),
    "generic-bearer-token": S(
        ["Authorization: Bearer ", R(B64URL + ".", 40, 80, pat=(20, 1024))],
        auto=("short", "flat", "badchar"),
        fps=(
            "Authorization: Bearer $TOKEN",
            "Authorization: Bearer ${OPENAI_API_KEY}",
            "Authorization: Bearer <token>",
        ),
    ),
}


# ---------------------------------------------------------------------------- public API


def true_positives(rule_id: str, n: int = 50, seed: int = 0) -> list[str]:
    """``n`` distinct realistic random secrets for ``rule_id`` (deterministic per seed)."""
    spec = SPECS[rule_id]
    rng = random.Random(f"tp/{rule_id}/{seed}")  # noqa: S311 - deterministic test data
    out: list[str] = []
    seen: set[str] = set()
    for _ in range(n * 50):
        s = _Render(rng)(spec.shape)
        if spec.keep is not None and not spec.keep(s):
            continue
        if s not in seen:
            seen.add(s)
            out.append(s)
            if len(out) == n:
                return out
    raise AssertionError(f"{rule_id}: could not draw {n} distinct samples")


def false_positives(rule_id: str) -> list[str]:
    """Near-misses that must not fire for ``rule_id`` (at least three per rule)."""
    spec = SPECS[rule_id]
    out = [_mutant(spec, kind, rule_id) for kind in spec.auto]
    out.extend(spec.fps)
    return out
