"""`wiregate` command line: argument parsing only; each subcommand calls one function.

wiregate init [--dir DIR] [--force] [--https-port N] [--mock-port N]
wiregate serve --config FILE [--workers N]
wiregate keys new-signing-key --out FILE
wiregate keys rotate --keyring FILE [--retire] [--stage]
wiregate keys activate --keyring FILE --id KEY_ID
wiregate profiles new --id ID --provider P --base-url URL --models PAT [PAT ...]
                      --credential env:NAME|file:PATH [--loopback-http] --sign-key FILE [--out FILE]
wiregate profiles sign FILE --key KEYFILE
wiregate profiles verify FILE [FILE ...] (--trusted PUBFILE ... | --config FILE)
wiregate principals add --id ID --profiles P [P ...] [--actions A ...] (--config FILE | --file FILE)
wiregate mock-provider (--port N | --uds PATH) [--api-key KEY]
"""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["serve"]:  # before the imports below (a few hundred ms): a signal is kept, not fatal
    from gateway.startup import EARLY

    EARLY.install()

import argparse
import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args
from urllib.parse import quote

from gateway.carriers import SHORT_NAMES
from gateway.config.model import Action


def _cmd_init(args: argparse.Namespace) -> int:
    from gateway import devsetup

    try:
        facts = devsetup.init(Path(args.dir), force=args.force, https_port=args.https_port, mock_port=args.mock_port)
    except FileExistsError as exc:
        print(f"wiregate init: {exc}", file=sys.stderr)
        return 1
    print(f"Created {facts['dir']}")
    print(f"  config:        {facts['config']}")
    print(f"  dev CA:        {facts['ca']}  (trust this in clients)")
    print(f"  https:         {facts['https']}")
    print(f"  unix socket:   {facts['socket']}")
    print(f"  mock provider: {facts['mock_provider']}  (served by `wiregate serve`; the mock-* models)")
    print(f"  signing key:   {facts['signing_key']}  (signs profiles; kept outside the served directory)")
    print(f"  gateway key:   {facts['gateway_key']}")
    print("  (shown once; also saved 0600 in dev-gateway-key for the README examples)")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.startup import EARLY

    EARLY.install()  # from here on a SIGHUP or SIGTERM while starting is kept, not fatal
    from gateway.config.load import ConfigError, read_config
    from gateway.context.store.database import StoreUnavailable
    from gateway.listeners import ListenerError
    from gateway.obs import logging as log
    from gateway.server import serve

    path = Path(args.config)
    try:
        config = read_config(path.resolve())
    except ConfigError as exc:
        print(f"wiregate serve: {exc}", file=sys.stderr)
        return 2
    log.configure(config.logging.level)
    _no_core_dumps()
    from gateway import workers

    inherited = workers.shared_from_env()
    if args.workers > 1 and inherited is None:
        try:
            return workers.Supervisor(path, args.workers).run()
        except (ConfigError, ListenerError, OSError) as exc:
            log.error("listen_failed", reason=str(exc), error_class=type(exc).__name__)
            print(f"wiregate serve: {exc}", file=sys.stderr)
            return 2
    shared = None
    if inherited is not None:
        from gateway.server import Shared

        index, port, uds = inherited
        log.PROCESS_FIELDS["worker"] = index
        shared = Shared(port, uds, index)
    runner = event_loop_runner(config.server.event_loop)
    try:
        runner(serve(path, shared))
    except ConfigError as exc:
        log.error("config_refused", reason=str(exc))
        print(f"wiregate serve: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:  # content-free by construction (the DSN never in it)
        log.error("store_unavailable", reason=str(exc), error_class=exc.error_class)
        print(f"wiregate serve: {exc}", file=sys.stderr)
        return 2
    except (ListenerError, OSError) as exc:
        log.error("listen_failed", reason=str(exc), error_class=type(exc).__name__)
        print(f"wiregate serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _no_core_dumps() -> None:
    """A core dump holds what the process held: the key ring, upstream credentials, every
    body in flight. `serve` turns them off for itself and for every process it starts (they
    inherit the limit), whatever the host's default."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def event_loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop when configured and importable (it cuts the gateway's added latency by about
    a third; see bench/README.md), else the standard loop, said out loud."""
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            from gateway.obs import logging as log

            log.warning("uvloop_unavailable", reason="falling back to the asyncio event loop")
        else:
            return uvloop.run
    return asyncio.run


def _cmd_new_signing_key(args: argparse.Namespace) -> int:
    from gateway import devsetup

    out = Path(args.out)
    if out.exists():
        print(f"wiregate keys: {out} exists; refusing to overwrite a key", file=sys.stderr)
        return 1
    key_id, public = devsetup.new_signing_key(out)
    print(json.dumps({"key_id": key_id, "public_key": public, "private_key_file": str(out)}))
    return 0


def _cmd_rotate(args: argparse.Namespace) -> int:
    from gateway import keyring as bindings

    try:
        new_id = bindings.rotate_keyring_file(Path(args.keyring), retire_after=args.retire, stage=args.stage)
    except bindings.KeyRingError as exc:
        print(f"wiregate keys rotate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"staged": new_id} if args.stage else {"active": new_id}))
    return 0


def _cmd_activate(args: argparse.Namespace) -> int:
    from gateway import keyring as bindings

    try:
        bindings.activate_keyring_key(Path(args.keyring), args.id)
    except bindings.KeyRingError as exc:
        print(f"wiregate keys activate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"active": args.id}))
    return 0


def _cmd_profiles_new(args: argparse.Namespace) -> int:
    from gateway import devsetup
    from gateway.config.load import ConfigError
    from gateway.profiles import signing
    from gateway.profiles.model import UpstreamProfile

    doc = devsetup.profile_document(
        id=args.id,
        provider=args.provider,
        base_url=args.base_url,
        models=args.models,
        credential=args.credential,
        carriers=args.carriers,
        loopback_http=args.loopback_http,
        fallbacks=args.fallbacks,
        expires=args.expires,
    )
    try:
        UpstreamProfile.model_validate(doc)
    except ValueError as exc:
        from pydantic import ValidationError

        from gateway.config.load import _validation_message

        msg = _validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        print(f"wiregate profiles new: invalid profile: {msg}", file=sys.stderr)
        return 1
    try:
        key = signing.load_private_key(Path(args.sign_key).read_bytes())
    except (OSError, ValueError, ConfigError) as exc:
        print(f"wiregate profiles new: cannot load signing key: {type(exc).__name__}", file=sys.stderr)
        return 1
    out = Path(args.out or f"{args.id}.json")
    devsetup.write_profile(out, doc, key)
    print(f"wrote signed profile {out}")
    return 0


def _cmd_profiles_sign(args: argparse.Namespace) -> int:
    from gateway import devsetup
    from gateway.config.load import parse_profile_json
    from gateway.profiles import signing

    path = Path(args.file)
    try:
        doc = parse_profile_json(path.read_bytes())
        key = signing.load_private_key(Path(args.key).read_bytes())
    except (OSError, ValueError) as exc:
        print(f"wiregate profiles sign: {path}: {exc}", file=sys.stderr)
        return 1
    devsetup.write_profile(path, doc, key)
    print(f"signed {path} with {signing.key_id_for(key.public_key())}")
    return 0


def _cmd_profiles_verify(args: argparse.Namespace) -> int:
    from gateway.config.load import ConfigError, load_profile, load_trusted_keys, read_config, resolve

    try:
        if args.config:
            cfg_path = Path(args.config).resolve()
            cfg = read_config(cfg_path)
            base = cfg_path.parent
            trusted = load_trusted_keys(cfg.trust.profile_keys, base)
        else:
            base = Path.cwd()
            trusted = load_trusted_keys(tuple(args.trusted or ()), base)
    except ConfigError as exc:
        print(f"wiregate profiles verify: {exc}", file=sys.stderr)
        return 1
    status = 0
    now = datetime.now(UTC)
    for name in args.files:
        try:
            loaded = load_profile(resolve(base, name) if args.config else Path(name), trusted, now, base)
        except ConfigError as exc:
            print(f"REFUSED {exc}")
            status = 1
        else:
            print(f"OK      profile {loaded.source}: id={loaded.profile.id} {loaded.digest}")
    return status


def _profile_id(path: Path) -> str | None:
    """The id a profile file declares (None when it cannot be read as one)."""
    from gateway.config.load import parse_profile_json

    try:
        value = parse_profile_json(path.read_bytes()).get("id")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def _cmd_principals_add(args: argparse.Namespace) -> int:
    """Append a principal, once the file with it would still load (an entry the gateway
    refuses would make every reload and the next start fail, and its key would never work)."""
    from gateway import devsetup
    from gateway.config.load import ConfigError, check_principals_text, read_config, resolve

    profile_ids: set[str] | None = None
    try:
        if args.config:
            cfg_path = Path(args.config).resolve()
            cfg = read_config(cfg_path)
            target = resolve(cfg_path.parent, cfg.principals_file)
            found = (_profile_id(p) for p in resolve(cfg_path.parent, cfg.profiles_dir).glob("*.json"))
            profile_ids = {pid for pid in found if pid is not None}
        else:
            target = Path(args.file)
        existing = target.read_text(encoding="utf-8") if target.exists() else ""
        key, digest = devsetup.new_gateway_key()
        block = devsetup.principal_block(args.id, [digest], args.actions, args.profiles, args.scopes)
        check_principals_text(existing + block, target, profile_ids)
    except (ConfigError, OSError, UnicodeDecodeError) as exc:
        reason = exc if isinstance(exc, ConfigError) else type(exc).__name__
        print(f"wiregate principals add: {reason}", file=sys.stderr)
        return 1
    if existing:
        with target.open("a", encoding="utf-8") as fh:
            fh.write(block)
    else:
        devsetup.write_private(target, block.encode())
    print(f"added principal {args.id} to {target} (reload the gateway: SIGHUP)")
    print(f"gateway key (shown once): {key}")
    return 0


def _cmd_mock(args: argparse.Namespace) -> int:
    from gateway.mockprovider import serve_forever
    from gateway.obs import logging as log

    log.configure("info")
    try:
        asyncio.run(
            serve_forever(
                host=args.host,
                port=args.port,
                uds=args.uds,
                api_key=args.api_key,
                cache_min_tokens=args.cache_min_tokens,
                time_scale=args.time_scale,
            )
        )
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_attribution(args: argparse.Namespace) -> int:
    import os

    from gateway import opsclient
    from gateway.config.load import ConfigError, read_config, resolve

    key = os.environ.get(opsclient.KEY_ENV, "").strip()  # a key file's trailing newline is not the key
    if not key or not key.isascii() or not key.isprintable():
        print(f"wiregate attribution: set {opsclient.KEY_ENV} to a gateway key (admin to switch)", file=sys.stderr)
        return 2
    uds = args.uds
    if args.config and not args.url and not uds:
        cfg_path = Path(args.config).resolve()
        try:
            cfg = read_config(cfg_path)
        except ConfigError as exc:
            print(f"wiregate attribution: {exc}", file=sys.stderr)
            return 1
        if cfg.server.uds is None:
            print("wiregate attribution: the configuration has no Unix socket; pass --url", file=sys.stderr)
            return 1
        uds = str(resolve(cfg_path.parent, cfg.server.uds.path))
    if args.action == "report":
        query = f"?scope={quote(args.scope, safe='')}" if args.scope else ""
        method, path, body = "GET", "/v1/attribution/report" + query, None
    else:
        method, path, body = "POST", "/v1/attribution/collection", {"collecting": args.action == "on"}
    try:
        status, answer = opsclient.call(method, path, key, body=body, uds=uds, url=args.url, cafile=args.cacert)
    except (OSError, ValueError) as exc:  # the class only: a message may quote the request, key included
        print(f"wiregate attribution: {type(exc).__name__}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2, sort_keys=True))
    return 0 if status == 200 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wiregate", description="wiregate model gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init", help="create a working directory with dev keys, profiles and certificates")
    p.add_argument("--dir", default=".wiregate")
    p.add_argument(
        "--force",
        action="store_true",
        help="regenerate every file init writes (a new profile-signing key, key ring and dev gateway key); "
        "without it init refuses, writing nothing, if any of them exists",
    )
    p.add_argument("--https-port", type=int, default=8443, help="the HTTPS listener's port")
    p.add_argument("--mock-port", type=int, default=9901, help="the bundled mock provider's loopback port")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("serve", help="serve HTTPS and the Unix socket")
    p.add_argument("--config", required=True)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        choices=range(1, 257),
        metavar="N",
        help="N gateway processes sharing the HTTPS port (SO_REUSEPORT) and the Unix socket",
    )
    p.set_defaults(func=_cmd_serve)

    keys = sub.add_parser("keys", help="profile-signing keys and the binding key ring").add_subparsers(
        dest="keys_cmd", required=True
    )
    p = keys.add_parser("new-signing-key", help="create an Ed25519 profile-signing key")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_new_signing_key)
    p = keys.add_parser("rotate", help="add a new active binding key; the old one stays accepted")
    p.add_argument("--keyring", required=True)
    p.add_argument("--retire", action="store_true", help="retire previously accepted keys")
    p.add_argument(
        "--stage",
        action="store_true",
        help="add the new key as accepted only (replicas open it, none seals with it); activate it later",
    )
    p.set_defaults(func=_cmd_rotate)
    p = keys.add_parser("activate", help="make a staged (accepted) binding key the active one")
    p.add_argument("--keyring", required=True)
    p.add_argument("--id", required=True, help="the key id `keys rotate --stage` printed")
    p.set_defaults(func=_cmd_activate)

    profiles = sub.add_parser("profiles", help="create, sign and verify UpstreamProfiles").add_subparsers(
        dest="profiles_cmd", required=True
    )
    p = profiles.add_parser("new", help="write a new signed profile")
    p.add_argument("--id", required=True)
    p.add_argument("--provider", required=True, choices=["openai", "anthropic", "openai-compatible"])
    p.add_argument("--base-url", required=True)
    p.add_argument("--models", required=True, nargs="+")
    p.add_argument("--credential", required=True, help="env:NAME or file:PATH (a reference, never the secret)")
    p.add_argument("--carriers", nargs="+", choices=sorted(SHORT_NAMES))
    p.add_argument("--loopback-http", action="store_true")
    p.add_argument("--fallbacks", nargs="+")
    p.add_argument("--expires", help="RFC 3339 time with timezone")
    p.add_argument("--sign-key", required=True)
    p.add_argument("--out")
    p.set_defaults(func=_cmd_profiles_new)
    p = profiles.add_parser("sign", help="(re)sign a profile file in place")
    p.add_argument("file")
    p.add_argument("--key", required=True)
    p.set_defaults(func=_cmd_profiles_sign)
    p = profiles.add_parser("verify", help="verify profile files against trusted keys")
    p.add_argument("files", nargs="+")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--trusted", nargs="+")
    group.add_argument("--config")
    p.set_defaults(func=_cmd_profiles_verify)

    principals = sub.add_parser("principals", help="manage principals").add_subparsers(
        dest="principals_cmd", required=True
    )
    p = principals.add_parser("add", help="add a principal and print its new gateway key once")
    p.add_argument("--id", required=True)
    p.add_argument("--profiles", required=True, nargs="+")
    p.add_argument(
        "--actions",
        nargs="+",
        default=["proxy"],
        choices=list(get_args(Action)),
    )
    p.add_argument("--scopes", nargs="+")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--config")
    group.add_argument("--file")
    p.set_defaults(func=_cmd_principals_add)

    p = sub.add_parser("attribution", help="token attribution: switch collection on or off, or print the report")
    p.add_argument("action", choices=["on", "off", "report"])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="reach the gateway on the Unix socket its configuration names")
    where.add_argument("--uds", help="the gateway's Unix socket")
    where.add_argument("--url", help="https://host:port of the gateway")
    p.add_argument("--cacert", help="CA file for --url (the dev CA: tls/ca.pem)")
    p.add_argument("--scope", help="report on one scope only")
    p.set_defaults(func=_cmd_attribution)

    p = sub.add_parser("mock-provider", help="run the bundled mock OpenAI/Anthropic provider")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument("--uds")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key")
    p.add_argument("--cache-min-tokens", type=int, default=1024, help="Anthropic minimum cacheable prefix")
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="cache time runs this many times faster (60: 1 s = 1 min; default $WIREGATE_MOCK_TIME_SCALE or 1)",
    )
    p.set_defaults(func=_cmd_mock)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
