"""The /ui/ pages in Debian's Chromium (Playwright, no browser download), against a live
gateway that carried real traffic through the bundled mock: sign-in by gateway key for a
short-lived HttpOnly/Secure/SameSite=Strict cookie, each page's figures equal the JSON
reports, the collection switch (CSRF-protected) goes off and on, the pages are keyboard
reachable, readable at 1280×800 and narrow, strict CSP, nothing from a third party.
Screenshots land in test-output/ui/ (git-ignored).

Skips when Chromium or Playwright is missing, except with WIREGATE_REQUIRE_CHROMIUM=1,
where that is a failure (CI: `apt-get install -y chromium`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, raw_client

CHROMIUM = Path(os.environ.get("WIREGATE_CHROMIUM", "/usr/bin/chromium"))
OUT = Path(__file__).resolve().parents[2] / "test-output" / "ui"
SECRET = "wg-ui-test-secret-7e1d0c9b"  # configured: a request carrying it is blocked


def _require_browser() -> Any:
    missing = None
    try:
        from playwright import sync_api
    except ImportError:
        missing = "Playwright for Python is not installed (pip install -c constraints.txt -e '.[test]')"
    else:
        if not CHROMIUM.exists():
            missing = f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    if missing is not None:
        if os.environ.get("WIREGATE_REQUIRE_CHROMIUM") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_api


@pytest.fixture(scope="module")
def live(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    _require_browser()
    with gateways("ui-pages", secrets_=[SECRET]) as (env, gateway):
        http = raw_client(gateway, env)
        auth = {"authorization": f"Bearer {env.gateway_key}"}
        assert http.post("/v1/attribution/collection", json={"collecting": True}, headers=auth).status_code == 200
        chat = openai_client(gateway, env)
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse. " * 400}]
        for turn in range(4):
            history.append({"role": "user", "content": f"question {turn}"})
            reply = chat.chat.completions.create(
                model="gpt-4.1", messages=history, tools=tools, extra_headers={"x-wiregate-session": "ui-s"}
            )
            history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        anthropic_client(gateway, env).messages.create(
            model="claude-sonnet-4-6",
            max_tokens=64,
            system="Answer briefly. " * 30,
            messages=[{"role": "user", "content": "hello"}],
        )
        # A reasoning model's answer: its usage names reasoning tokens (within the output).
        thought = {
            "id": "chatcmpl-ui-reasoning",
            "object": "chat.completion",
            "created": 0,
            "model": "o4-mini",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}}],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 40,
                "total_tokens": 52,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 37},
            },
        }
        sid = "ui" + uuid.uuid4().hex[:10]
        mock.state.add_scenario(sid, [{"raw_body": json.dumps(thought), "content_type": "application/json"}])
        chat.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": f"mock-scenario:{sid}"}])
        blocked = http.post(
            "/v1/chat/completions",
            json={"model": "gpt-4.1", "messages": [{"role": "user", "content": f"key {SECRET}"}]},
            headers=auth,
        )
        assert blocked.status_code >= 400
        yield env, gateway


@pytest.fixture(scope="module")
def browser(live: tuple[Env, GatewayThread]) -> Iterator[Any]:
    sync_api = _require_browser()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


def _context(browser: Any, gateway: GatewayThread, width: int = 1280, height: int = 800) -> Any:
    context = browser.new_context(ignore_https_errors=True, viewport={"width": width, "height": height})
    context.set_default_timeout(15_000)
    return context


def _sign_in(context: Any, gateway: GatewayThread, key: str) -> Any:
    page = context.new_page()
    foreign: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(gateway.https_url) else foreign.append(r.url))
    page.goto(gateway.https_url + "/ui/")
    page.wait_for_selector("#sign-in:enabled")  # the script took over the form
    page.fill("#key", key)
    page.press("#key", "Enter")
    page.wait_for_url("**/ui/context.html")
    page.wait_for_selector("body[data-ready=true]")
    page.foreign = foreign  # type: ignore[attr-defined]
    return page


def _json(gateway: GatewayThread, env: Env, path: str) -> Any:
    response = raw_client(gateway, env).get(path, headers={"authorization": f"Bearer {env.gateway_key}"})
    assert response.status_code == 200
    return response.json()


def _shot(page: Any, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / name), full_page=True)


def _fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


def test_sign_in_context_map_equals_the_report_and_switch(live: tuple[Env, GatewayThread], browser: Any) -> None:
    env, gateway = live
    context = _context(browser, gateway)
    page = _sign_in(context, gateway, env.gateway_key)
    cookie = next(c for c in context.cookies() if c["name"] == "wiregate_ui")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert env.gateway_key not in json.dumps(context.cookies())

    report = _json(gateway, env, "/v1/attribution/report")
    assert report["boundaries"] == 6  # four chat turns, the messages call and the reasoning answer
    summary = page.locator('#summary [data-field="partition.compiledMaterialized"]').inner_text()
    assert summary == str(report["partition"]["compiledMaterialized"])
    assert page.locator('#summary [data-field="boundaries"]').inner_text() == str(report["boundaries"])
    assert page.locator('#summary [data-field="controllableMaterialized"]').inner_text() == str(
        report["controllableMaterialized"]
    )
    for row in report["ledger"]:
        tr = page.locator(f'#ledger tr[data-block="{row["blockId"]}"]')
        for field in ("cumulativeMaterializedEstimate", "injectionCount", "cumulativeExposureEstimate"):
            assert tr.locator(f'td[data-field="{field}"]').inner_text() == str(row.get(field, "—")), field
        tile = page.locator(f'#map .tile[data-block="{row["blockId"]}"]')
        assert tile.get_attribute("data-value") == str(row["cumulativeMaterializedEstimate"])
        assert f"origin-{row['origin']}" in (tile.get_attribute("class") or "")
    shown = page.locator("#opportunities li[data-block]")
    assert shown.count() == len(report["opportunities"]) <= 12
    for n, item in enumerate(report["opportunities"]):
        assert shown.nth(n).get_attribute("data-block") == item["blockId"]
        assert shown.nth(n).locator('[data-field="value"]').inner_text() == str(item["value"])

    # Strict CSP, no inline script, nothing from a third party.
    response = page.request.get(gateway.https_url + "/ui/context.html")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert page.evaluate("[...document.scripts].every(s => s.src && !s.textContent.trim())")
    assert page.foreign == []  # type: ignore[attr-defined]

    # Keyboard: Tab reaches a sort button of the ledger; Enter sorts by it.
    page.locator("body").focus()
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement && document.activeElement.dataset.sort === 'blockId'"):
            break
    else:
        pytest.fail("the ledger's sort buttons are not reachable by keyboard")
    page.keyboard.press("Enter")
    assert page.locator('#ledger th[aria-sort="descending"] button[data-sort="blockId"]').count() == 1
    _shot(page, "context-1280.png")

    # The switch: off, then on again, as the API sees it; a POST without the CSRF token is refused.
    button = page.locator("#collection")
    assert button.get_attribute("aria-pressed") == "true"
    button.click()
    page.wait_for_selector('#collection[aria-pressed="false"]')
    assert _json(gateway, env, "/v1/attribution/collection") == {"collecting": False}
    button.click()
    page.wait_for_selector('#collection[aria-pressed="true"]')
    assert _json(gateway, env, "/v1/attribution/collection") == {"collecting": True}
    forged = page.request.post(gateway.https_url + "/ui/api/collection", data={"collecting": False})
    assert forged.status == 403
    assert _json(gateway, env, "/v1/attribution/collection") == {"collecting": True}

    narrow = _context(browser, gateway, 390, 844)
    small = _sign_in(narrow, gateway, env.gateway_key)
    assert _fits(small)
    _shot(small, "context-narrow.png")
    narrow.close()
    context.close()


def test_usage_page_equals_the_usage_report(live: tuple[Env, GatewayThread], browser: Any) -> None:
    env, gateway = live
    context = _context(browser, gateway)
    page = _sign_in(context, gateway, env.gateway_key)
    page.goto(gateway.https_url + "/ui/usage.html")
    page.wait_for_selector("body[data-ready=true]")
    report = _json(gateway, env, "/v1/usage/report")
    assert report["profiles"]
    for pid, entry in report["profiles"].items():
        bar = page.locator(f'#shares .bar[data-profile="{pid}"]')
        assert bar.get_attribute("data-input") == str(entry["tokens"]["input_total"]["known"])
        assert bar.get_attribute("data-read") == str(entry["tokens"]["cache_read"]["known"])
        cells = page.locator("#profiles tbody tr", has_text=pid).filter(has_text="input_total").first
        assert cells.locator("td").nth(2).inner_text() == str(entry["tokens"]["input_total"]["known"])
    assert page.locator("#timeline tbody tr").count() >= 1
    # Every kind the chart draws, summed over its minutes, is the report's figure (this
    # process carried all the traffic, within the timeline's day); reasoning included.
    minutes = page.locator("#series .bar.minute")
    assert minutes.count() >= 1
    drawn: dict[str, int] = {}
    for kind in ("input_uncached", "cache_read", "cache_write", "output", "reasoning"):
        attribute = "data-" + kind.replace("_", "-")  # app.js: dataset.inputUncached and so on
        drawn[kind] = sum(int(minutes.nth(i).get_attribute(attribute) or -1) for i in range(minutes.count()))
        reported = sum(
            entry["tokens"][kind]["known"] + entry["tokens"][kind]["estimated"]
            for entry in report["profiles"].values()
            if kind in entry["tokens"]
        )
        assert drawn[kind] == reported, (kind, drawn[kind], reported)
    assert drawn["reasoning"] == 37  # the reasoning answer's tokens, drawn
    assert page.get_by_text("reasoning (within output)").count() == 1
    assert _fits(page)
    _shot(page, "usage-1280.png")
    page.set_viewport_size({"width": 390, "height": 844})
    assert _fits(page)
    _shot(page, "usage-narrow.png")
    context.close()


def _metric_sums(text: str) -> dict[tuple[str, str, str], float]:
    sums: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        match = re.match(r"wiregate_decisions_total\{(.*)\} ([0-9.e+]+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            key = (labels["phase"], labels["decision"], labels["reason"])
            sums[key] = sums.get(key, 0) + float(match.group(2))
    return sums


def test_decisions_page_equals_the_metrics(live: tuple[Env, GatewayThread], browser: Any) -> None:
    env, gateway = live
    context = _context(browser, gateway)
    page = _sign_in(context, gateway, env.gateway_key)
    page.goto(gateway.https_url + "/ui/decisions.html")
    page.wait_for_selector("body[data-ready=true]")
    metrics = raw_client(gateway, env).get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
    sums = _metric_sums(metrics)
    assert any(decision == "block" for _, decision, _ in sums)
    columns = {"allow": 1, "block": 2, "withhold": 3}
    for (phase, decision, reason), value in sums.items():
        row = page.locator("#by-reason tbody tr").filter(has_text=f"{phase} · {reason}").first
        assert row.locator("td").nth(columns[decision]).inner_text() == str(int(value)), (phase, decision, reason)
    route = page.locator("#by-route tbody tr").filter(has_text="/v1/chat/completions").first
    assert int(route.locator("td").nth(2).inner_text()) >= 1  # the blocked call
    assert _fits(page)
    _shot(page, "decisions-1280.png")
    page.set_viewport_size({"width": 390, "height": 844})
    assert _fits(page)
    context.close()


def test_only_observers_sign_in_and_only_admins_switch(live: tuple[Env, GatewayThread], browser: Any) -> None:
    env, gateway = live
    viewer = env.add_principal("ui-viewer", ["observe"], [])
    caller = env.add_principal("ui-caller", ["proxy"], ["mock-openai"])
    assert gateway.reload()
    context = _context(browser, gateway)
    page = _sign_in(context, gateway, viewer)
    assert page.locator("#collection").is_disabled()
    refused = page.request.post(
        gateway.https_url + "/ui/api/collection",
        data={"collecting": False},
        headers={"x-wiregate-csrf": page.evaluate("fetch('/ui/api/session').then(r => r.json()).then(j => j.csrf)")},
    )
    assert refused.status == 403
    context.close()
    other = _context(browser, gateway)
    login = other.new_page()
    login.goto(gateway.https_url + "/ui/")
    login.wait_for_selector("#sign-in:enabled")
    login.fill("#key", caller)
    login.press("#key", "Enter")
    login.wait_for_selector("#login-status:not(:empty)")
    assert login.url.endswith("/ui/")
    unauthenticated = other.request.get(gateway.https_url + "/ui/api/attribution")
    assert unauthenticated.status == 401
    assert other.request.get(gateway.https_url + "/ui/context.html", max_redirects=0).status == 303
    other.close()


def test_the_readme_shows_a_screenshot_of_each_page() -> None:
    """The README's three screenshots are PNGs of the pages at 1280 pixels wide, as these
    tests take them; WIREGATE_UPDATE_DOCS=1 first copies the ones this run took into docs/."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = ("context", "usage", "decisions")
    if os.environ.get("WIREGATE_UPDATE_DOCS") == "1":
        docs.mkdir(exist_ok=True)
        for page in pages:
            shutil.copy(OUT / f"{page}-1280.png", docs / f"ui-{page}.png")
    readme = (docs.parent / "README.md").read_text()
    for page in pages:
        assert f"](docs/ui-{page}.png)" in readme
        head = (docs / f"ui-{page}.png").read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
        assert int.from_bytes(head[16:20], "big") == 1280, page  # the width the pages are shot at
