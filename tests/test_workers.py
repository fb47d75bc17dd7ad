"""`wiregate serve --workers N` (issue 12): N processes share the HTTPS port (SO_REUSEPORT)
and the Unix socket, reload together on SIGHUP, stop together on SIGTERM, and a worker that
dies is replaced."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from gateway import devsetup
from gateway.mockprovider import MockProviderServer
from gateway.startup import EARLY
from gateway.workers import Supervisor
from tests.deploy import procs
from tests.harness import Env, build_env

WIREGATE = Path(sys.executable).with_name("wiregate")


def _chat(client: httpx.Client, key: str) -> int:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]},
        headers={"authorization": f"Bearer {key}"},
    )
    return r.status_code


def _served_by(proc: procs.Proc, since: int = 0) -> Counter[int]:
    """Chat calls per worker, in the records from `since` on."""
    return Counter(
        int(r["worker"])
        for r in proc.records()[since:]
        if r.get("event") == "request" and r.get("route") == "/v1/chat/completions"
    )


def _count(proc: procs.Proc, event: str) -> int:
    return sum(1 for r in proc.records() if r.get("event") == event)


def _two_workers(env: Env, tmp_path: Path) -> procs.Proc:
    """`wiregate serve --workers 2` on `env`, once both workers have started."""
    proc = procs.Proc(
        [str(WIREGATE), "serve", "--config", str(env.config), "--workers", "2"], dict(os.environ), tmp_path / "log"
    )
    try:
        _wait(lambda: _count(proc, "started") == 2)
    except BaseException:
        proc.close()
        raise
    return proc


def _one_call_each_way(proc: procs.Proc, env: Env, key: str) -> list[int]:
    """One chat call over HTTPS and one over the Unix socket, each on a new connection (the
    kernel picks the worker)."""
    tls = ssl.create_default_context(cafile=str(env.ca))
    statuses = []
    with httpx.Client(base_url=f"https://127.0.0.1:{proc.https_port()}", verify=tls, timeout=30) as client:
        statuses.append(_chat(client, key))
    uds = httpx.HTTPTransport(uds=str(env.dir / "run" / "gw.sock"))
    with httpx.Client(transport=uds, base_url="http://localhost", timeout=30) as client:
        statuses.append(_chat(client, key))
    return statuses


def _parent(pid: int) -> int:
    """The parent pid of a live process; 0 once it is gone (or a zombie nobody reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return 0 if fields[0] == "Z" else int(fields[1])


def _check_workers(pid: int) -> set[int]:
    """The check-worker processes `pid` started (its pool; not multiprocessing's tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid:
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in argv:
                found.add(int(entry.name))
    return found


def _wait(predicate, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_two_workers_share_both_listeners_reload_restart_and_stop_together(
    mock: MockProviderServer, tmp_path: Path
) -> None:
    env = build_env(tmp_path / "gw", mock.url)
    sock = env.dir / "run" / "gw.sock"
    proc = _two_workers(env, tmp_path)
    try:
        pids = {int(r["pid"]) for r in proc.records() if r.get("event") == "worker_started"}
        assert len(pids) == 2 and proc.pid not in pids

        def one_call_each_way(key: str) -> list[int]:
            return _one_call_each_way(proc, env, key)

        for _ in range(30):
            assert one_call_each_way(env.gateway_key) == [200, 200]
        served = _served_by(proc)
        assert set(served) == {0, 1} and sum(served.values()) == 60, served

        # SIGHUP to the supervisor: every worker reloads (a principal added on disk now works everywhere).
        key, digest = devsetup.new_gateway_key()
        with (env.dir / "principals.toml").open("a") as fh:
            fh.write(devsetup.principal_block("late", [digest], ["proxy"], ["mock-openai"], None))
        assert one_call_each_way(key) == [401, 401]
        proc.popen.send_signal(signal.SIGHUP)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "config_reloaded") == 2)
        for _ in range(10):
            assert one_call_each_way(key) == [200, 200]

        # A worker that dies is replaced; the gateway keeps answering meanwhile, and the dead
        # worker's check workers (its process pool) end with it instead of staying behind.
        victim = next(iter(pids))
        _wait(lambda: len(_check_workers(victim)) == 2)  # check_workers = 2, started with the process
        pool = _check_workers(victim)
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: not any(Path(f"/proc/{pid}").exists() and _parent(pid) != 0 for pid in pool), timeout=30)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "worker_started") == 3)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 3)
        for _ in range(10):
            assert one_call_each_way(env.gateway_key) == [200, 200]

        # SIGTERM: all of them drain and stop; the socket file goes with the supervisor.
        assert proc.terminate(120) == 0
        assert not sock.exists()
        assert sum(1 for r in proc.records() if r.get("event") == "draining") == 2
    finally:
        proc.close()


def test_workers_on_the_embedded_defaults_share_one_mock(tmp_path: Path) -> None:
    """`wiregate init`'s configuration (embedded mock on) under --workers 2: worker 0 serves
    the mock, both workers serve calls to it."""
    work = tmp_path / "wg"
    mock_port = procs.free_port()
    init = [str(WIREGATE), "init", "--dir", str(work), "--https-port", "0", "--mock-port", str(mock_port)]
    assert subprocess.run(init, capture_output=True, timeout=120).returncode == 0
    key = (work / "dev-gateway-key").read_text().strip()
    proc = procs.Proc(
        [str(WIREGATE), "serve", "--config", str(work / "wiregate.toml"), "--workers", "2"],
        dict(os.environ),
        tmp_path / "log",
    )
    try:
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 2)
        mocks = [r for r in proc.records() if r.get("event") == "listening" and r.get("listener") == "mock_provider"]
        assert [r["worker"] for r in mocks] == [0]
        sock = work / "run" / "wiregate.sock"
        proc.wait_status(lambda: procs.uds(sock), "/readyz")
        for _ in range(20):
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://localhost", timeout=30
            ) as c:
                r = c.post(
                    "/v1/chat/completions",
                    json={"model": "mock-gpt-1", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer {key}"},
                )
                assert r.status_code == 200, r.text
        assert proc.terminate(120) == 0
    finally:
        proc.close()


def test_a_worker_that_cannot_restart_leaves_the_others_serving(mock: MockProviderServer, tmp_path: Path) -> None:
    """The files on disk were broken after the workers loaded them (a SIGHUP was refused and
    both kept the old configuration), then one worker dies: its restarts fail, but the other
    keeps serving, and the slot comes back once the files are fixed."""
    env = build_env(tmp_path / "gw", mock.url)
    sock = env.dir / "run" / "gw.sock"
    proc = procs.Proc(
        [str(WIREGATE), "serve", "--config", str(env.config), "--workers", "2"], dict(os.environ), tmp_path / "log"
    )
    policy = env.dir / "policy.toml"
    good = policy.read_bytes()
    try:
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 2)
        pids = [int(r["pid"]) for r in proc.records() if r.get("event") == "worker_started"]
        policy.write_bytes(b'version = ""\n')  # refused by every loader
        proc.popen.send_signal(signal.SIGHUP)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "config_reload_failed") >= 2, timeout=90)
        os.kill(pids[0], signal.SIGKILL)
        _wait(lambda: any(r.get("event") == "worker_respawn_delayed" for r in proc.records()), timeout=90)
        assert proc.popen.poll() is None  # the supervisor did not give up
        uds = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=uds, base_url="http://localhost", timeout=30) as client:
            for _ in range(5):
                assert _chat(client, env.gateway_key) == 200
        policy.write_bytes(good)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 3, timeout=90)
        assert proc.terminate(120) == 0
    finally:
        policy.write_bytes(good)
        proc.close()


def test_a_stop_asked_while_the_supervisor_starts_is_honoured(mock: MockProviderServer, tmp_path: Path) -> None:
    """`wiregate serve` keeps a SIGTERM that arrives before its handlers exist (`EARLY`);
    the supervisor then starts no worker and returns as a clean stop."""
    env = build_env(tmp_path / "gw", mock.url)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    EARLY.stop = True
    try:
        supervisor = Supervisor(env.config, 2)
        assert supervisor.run() == 0
        assert supervisor.workers == []
        assert not (env.dir / "run" / "gw.sock").exists()
    finally:
        EARLY.stop = False
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_ui_session_is_known_to_every_worker_and_sign_out_ends_it_everywhere(
    mock: MockProviderServer, tmp_path: Path
) -> None:
    """The kernel spreads a browser's connections over the workers: a session made by one
    must open on the other, and a sign-out that reaches either ends it on both (sessions
    were once kept per process: half the page loads signed out, and a sign-out on the other
    worker left the session live)."""
    env = build_env(tmp_path / "gw", mock.url)
    proc = procs.Proc(
        [str(WIREGATE), "serve", "--config", str(env.config), "--workers", "2"], dict(os.environ), tmp_path / "log"
    )
    try:
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 2)
        base = f"https://127.0.0.1:{proc.https_port()}"
        tls = ssl.create_default_context(cafile=str(env.ca))
        with httpx.Client(base_url=base, verify=tls, timeout=30) as client:
            token = client.post("/ui/login", json={"key": env.gateway_key}).cookies["wiregate_ui"]

        def fresh() -> httpx.Client:  # a new connection each time: the kernel picks a worker
            return httpx.Client(base_url=base, verify=tls, timeout=30, cookies={"wiregate_ui": token})

        answers = []
        for _ in range(20):
            with fresh() as client:
                answers.append(client.get("/ui/api/session"))
        assert [r.status_code for r in answers] == [200] * 20
        csrf = answers[0].json()["csrf"]
        assert {r.json()["csrf"] for r in answers} == {csrf}

        def session_workers(status: int) -> set[int]:
            return {
                int(r["worker"])
                for r in proc.records()
                if r.get("event") == "request" and r.get("route") == "/ui/api/session" and r.get("status") == status
            }

        _wait(lambda: len([r for r in proc.records() if r.get("route") == "/ui/api/session"]) == 20)
        assert session_workers(200) == {0, 1}  # both workers opened it
        with fresh() as client:
            assert client.post("/ui/logout", json={}, headers={"x-wiregate-csrf": csrf}).status_code == 200
        for _ in range(12):
            with fresh() as client:
                assert client.get("/ui/api/session").status_code == 401
        _wait(lambda: len([r for r in proc.records() if r.get("route") == "/ui/api/session"]) == 32)
        assert session_workers(401) == {0, 1}  # ended on both
    finally:
        proc.terminate(120)
        proc.close()


def test_a_reload_while_the_workers_are_starting_kills_none_of_them(mock: MockProviderServer, tmp_path: Path) -> None:
    """The supervisor forwards SIGHUP to workers it started a moment ago, still loading
    Python: they start with it blocked and act on it once they can (its default action
    killed them, and two such deaths in a row stopped the whole service)."""
    env = build_env(tmp_path / "gw", mock.url)
    proc = procs.Proc(
        [str(WIREGATE), "serve", "--config", str(env.config), "--workers", "2"], dict(os.environ), tmp_path / "log"
    )
    try:
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "worker_started") == 2, timeout=30)
        for _ in range(3):  # at once, while both workers are importing
            proc.popen.send_signal(signal.SIGHUP)
            time.sleep(0.05)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "started") == 2)
        _wait(lambda: sum(1 for r in proc.records() if r.get("event") == "config_reloaded") >= 2)
        port = proc.https_port()
        tls = ssl.create_default_context(cafile=str(env.ca))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=tls, timeout=30) as client:
            assert _chat(client, env.gateway_key) == 200
        events = [r.get("event") for r in proc.records()]
        assert "worker_exited" not in events and events.count("worker_started") == 2, events
        assert proc.popen.poll() is None
    finally:
        proc.terminate(120)
        proc.close()


def test_a_restarted_worker_and_the_others_serve_the_same_files(mock: MockProviderServer, tmp_path: Path) -> None:
    """The files on disk changed without a SIGHUP (a principal added), then a worker dies:
    its replacement loads the files as they are now, and the others reload with it, so no
    worker keeps serving what the others no longer do (or the reverse)."""
    env = build_env(tmp_path / "gw", mock.url)
    proc = _two_workers(env, tmp_path)
    try:
        pids = [int(r["pid"]) for r in proc.records() if r.get("event") == "worker_started"]
        key, digest = devsetup.new_gateway_key()
        with (env.dir / "principals.toml").open("a") as fh:
            fh.write(devsetup.principal_block("late", [digest], ["proxy"], ["mock-openai"], None))
        os.kill(pids[0], signal.SIGKILL)
        _wait(lambda: _count(proc, "started") == 3)
        _wait(lambda: _count(proc, "config_reloaded") == 1)
        assert _count(proc, "workers_reloading") == 1
        mark = len(proc.records())
        statuses = [status for _ in range(20) for status in _one_call_each_way(proc, env, key)]
        assert statuses == [200] * 40
        served = _served_by(proc, since=mark)
        assert set(served) == {0, 1}, served  # both workers answered, and both knew the key
        assert proc.terminate(120) == 0
    finally:
        proc.close()
