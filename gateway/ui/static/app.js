// wiregate /ui/: one script for every page (no inline script: strict CSP). It fetches the
// same JSON the API serves and renders numbers as they are, never any content.
"use strict";

const ORIGINS = ["host_policy", "host_generated", "workspace_configuration", "user_task_payload", "unknown"];
let csrf = "";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function fmt(n) {
  return n === undefined || n === null ? "—" : String(n);
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  if (response.status === 401) {
    window.location.assign("/ui/");
    throw new Error("signed out");
  }
  if (!response.ok) throw new Error("request failed: " + response.status);
  return response.json();
}

function post(path, body) {
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-wiregate-csrf": csrf },
    body: JSON.stringify(body),
  });
}

function status(text) {
  const node = document.getElementById("status");
  if (node) node.textContent = text;
}

function table(id, headers, rows, numeric) {
  const t = document.getElementById(id);
  t.replaceChildren();
  const head = el("tr");
  headers.forEach((h, i) => head.append(el("th", { scope: "col", class: numeric[i] ? "num" : "", text: h })));
  t.append(el("thead", {}, head));
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr");
    r.forEach((cell, i) => tr.append(el("td", { class: numeric[i] ? "num" : "", text: fmt(cell) })));
    body.append(tr);
  }
  t.append(body);
}

// --- session header: collection switch and sign-out ------------------------------------

async function header() {
  const session = await api("/ui/api/session");
  csrf = session.csrf;
  const button = document.getElementById("collection");
  const paint = (on) => {
    button.textContent = "Collection: " + (on ? "on" : "off");
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.dataset.collecting = on ? "true" : "false";
  };
  paint(session.collecting);
  if (!session.admin) {
    button.disabled = true;
    button.title = "Switching needs the admin action";
  }
  button.addEventListener("click", async () => {
    const next = button.dataset.collecting !== "true";
    const answer = await post("/ui/api/collection", { collecting: next });
    paint(answer.collecting);
    status("Collection is " + (answer.collecting ? "on" : "off") + ".");
  });
  document.getElementById("logout").addEventListener("click", async () => {
    await post("/ui/logout", {});
    window.location.assign("/ui/");
  });
}

// --- context map ------------------------------------------------------------------------

const LEDGER_COLUMNS = [
  ["blockId", "Block id", false],
  ["displayName", "Name", false],
  ["origin", "Origin", false],
  ["control", "Control", false],
  ["lifetime", "Lifetime", false],
  ["injectionCount", "Injections", true],
  ["injectionCoverage", "Coverage", true],
  ["meanTokensWhenInjected", "Mean when injected", true],
  ["cumulativeMaterializedEstimate", "Materialized", true],
  ["cumulativeExposureEstimate", "Exposure", true],
  ["cumulativeControllableExposureEstimate", "Controllable exposure", true],
  ["cumulativeTargetExposureEstimate", "Target exposure", true],
  ["cumulativeAddressableExposureEstimate", "Addressable", true],
  ["estimator", "Estimator", false],
];
let ledgerRows = [];
let sortKey = "cumulativeMaterializedEstimate";
let sortDown = true;

function renderLedger() {
  const rows = ledgerRows.slice().sort((a, b) => {
    const x = a[sortKey], y = b[sortKey];
    const cmp = typeof x === "number" || typeof y === "number" ? (x ?? -1) - (y ?? -1) : String(x).localeCompare(String(y));
    return (sortDown ? -cmp : cmp) || a.blockId.localeCompare(b.blockId);
  });
  const t = document.getElementById("ledger");
  t.replaceChildren();
  const head = el("tr");
  for (const [key, label, num] of LEDGER_COLUMNS) {
    const th = el("th", { scope: "col", class: num ? "num" : "" });
    const sorted = key === sortKey;
    th.setAttribute("aria-sort", sorted ? (sortDown ? "descending" : "ascending") : "none");
    const b = el("button", { type: "button", text: label + (sorted ? (sortDown ? " ▼" : " ▲") : "") });
    b.dataset.sort = key;
    b.addEventListener("click", () => {
      sortDown = key === sortKey ? !sortDown : true;
      sortKey = key;
      renderLedger();
      t.querySelector(`button[data-sort="${key}"]`).focus();
    });
    th.append(b);
    head.append(th);
  }
  t.append(el("thead", {}, head));
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr");
    tr.dataset.block = r.blockId;
    for (const [key, , num] of LEDGER_COLUMNS) {
      const td = el("td", { class: num ? "num" : "", text: fmt(r[key]) });
      td.dataset.field = key;
      tr.append(td);
    }
    body.append(tr);
  }
  t.append(body);
}

async function contextPage() {
  const form = document.getElementById("filters");
  const load = async () => {
    const seconds = Number(document.getElementById("window").value);
    const params = new URLSearchParams({ since: String(Date.now() / 1000 - seconds) });
    const scope = document.getElementById("scope").value.trim();
    if (scope) params.set("scope", scope);
    const report = await api("/ui/api/attribution?" + params.toString());
    renderContext(report);
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    load().catch((err) => status(err.message));
  });
  await load();
}

function renderContext(report) {
  document.querySelectorAll('[data-field="estimator.name"]').forEach((n) => (n.textContent = report.estimator.name));
  const summary = document.getElementById("summary");
  summary.replaceChildren();
  const figures = [
    ["boundaries", "Calls (input boundaries)", report.boundaries],
    ["replaysDeduplicated", "Retries counted once", report.replaysDeduplicated],
    ["exposure.status", "Exposure evidence", report.exposure.status],
    ["partition.compiledMaterialized", "Compiled materialized", report.partition.compiledMaterialized],
    ["controllableMaterialized", "Controllable materialized", report.controllableMaterialized],
    ["limited", "Ledger", report.limited ? "limited (" + report.limitReasons.join(", ") + ")" : "complete"],
  ];
  for (const [field, label, value] of figures) {
    const dd = el("dd", { text: fmt(value) });
    dd.dataset.field = field;
    if (field === "limited" && report.limited) dd.className = "limited";
    summary.append(el("div", {}, el("dt", { text: label }), dd));
  }
  const map = document.getElementById("map");
  map.replaceChildren();
  const total = report.partition.compiledMaterialized;
  for (const r of report.ledger) {
    if (!total || r.cumulativeMaterializedEstimate <= 0) continue;
    const share = r.cumulativeMaterializedEstimate / total;
    const tile = el("div", { class: "tile origin-" + r.origin, role: "listitem", tabindex: "0" });
    tile.style.width = (share * 100).toFixed(3) + "%";
    tile.dataset.block = r.blockId;
    tile.dataset.value = String(r.cumulativeMaterializedEstimate);
    const label = `${r.displayName}: ${r.cumulativeMaterializedEstimate} (${(share * 100).toFixed(1)}%), ${r.origin}`;
    tile.setAttribute("aria-label", label);
    tile.title = label;
    tile.append(el("span", { text: r.displayName }), el("span", { text: String(r.cumulativeMaterializedEstimate) }));
    map.append(tile);
  }
  const legend = document.getElementById("legend");
  legend.replaceChildren(
    ...ORIGINS.map((o) => el("li", {}, el("span", { class: "swatch origin-" + o, "aria-hidden": "true" }), o))
  );
  const top = document.getElementById("opportunities");
  top.replaceChildren();
  for (const o of report.opportunities) {
    const value = el("span", { class: "value", text: String(o.value) });
    value.dataset.field = "value";
    const li = el("li", {}, el("strong", { text: o.displayName }), " — ", value, ` (${o.estimator}). ${o.suggestedAction} `,
      el("em", { text: "Validate: " + o.requiredValidation }));
    li.dataset.block = o.blockId;
    top.append(li);
  }
  if (!report.opportunities.length) top.append(el("li", { text: "No opportunity in this window." }));
  const p = report.partition;
  table("partition", ["Part", "Estimate"], [
    ["owned", p.owned], ["workspaceConfiguration", p.workspaceConfiguration], ["userTaskPayload", p.userTaskPayload],
    ["unknown", p.unknown], ["compiledMaterialized (sum)", p.compiledMaterialized],
    ["controllableMaterialized (separate view)", report.controllableMaterialized],
  ], [false, true]);
  const kinds = report.providerUsage.kinds;
  table("provider", ["Kind", "Known", "Estimated", "Unknown (calls)"],
    Object.entries(kinds).map(([k, v]) => [k, v.known, v.estimated, v.unknown_records]), [false, true, true, true]);
  ledgerRows = report.ledger;
  renderLedger();
  status(`Window ${new Date(report.window.since * 1000).toISOString()} – ${new Date(report.window.until * 1000).toISOString()}`);
}

// --- usage and cache efficiency -----------------------------------------------------------

async function usagePage() {
  const data = await api("/ui/api/usage");
  const profiles = data.report.profiles;
  const kinds = data.report.kinds;
  const rows = [];
  for (const [pid, entry] of Object.entries(profiles)) {
    for (const kind of kinds) {
      const t = entry.tokens[kind];
      if (t) rows.push([pid, kind, t.known, t.estimated, t.unknown_records]);
    }
  }
  table("profiles", ["Profile", "Kind", "Known", "Estimated", "Unknown (records)"], rows, [false, false, true, true, true]);
  const shares = document.getElementById("shares");
  shares.replaceChildren();
  for (const [pid, entry] of Object.entries(profiles)) {
    const input = entry.tokens.input_total ? entry.tokens.input_total.known : 0;
    const read = entry.tokens.cache_read ? entry.tokens.cache_read.known : 0;
    const share = input > 0 ? read / input : 0;
    const fill = el("div", { class: "fill kind-1" });
    fill.style.width = (share * 100).toFixed(2) + "%";
    const bar = el("div", { class: "bar" }, el("span", { class: "label", text: pid }),
      el("div", { class: "track", role: "img", "aria-label": `${pid}: ${(share * 100).toFixed(1)}% cached` }, fill),
      el("span", { text: `${(share * 100).toFixed(1)}% (${read} of ${input})` }));
    bar.dataset.profile = pid;
    bar.dataset.read = String(read);
    bar.dataset.input = String(input);
    shares.append(bar);
  }
  const series = document.getElementById("series");
  series.replaceChildren();
  const perBucket = data.timeline.usage.map((b) => {
    const byKind = {};
    for (const c of b.counts) byKind[c.kind] = (byKind[c.kind] || 0) + c.tokens;
    return [b.start, byKind];
  });
  // Stacked: the kinds that add up to a call's tokens. Reasoning is part of the output (as the
  // providers count it), so it is drawn on a track of its own under each minute, same scale.
  const shown = ["input_uncached", "cache_read", "cache_write", "output"];
  const max = Math.max(1, ...perBucket.map(([, k]) => shown.reduce((s, x) => s + (k[x] || 0), 0)));
  const segment = (kind, i, n) => {
    const f = el("div", { class: "fill kind-" + i, title: `${kind}: ${n}` });
    f.style.width = ((n / max) * 100).toFixed(2) + "%";
    return f;
  };
  for (const [start, byKind] of perBucket) {
    const track = el("div", { class: "track", role: "img", "aria-label": shown.map((k) => `${k} ${byKind[k] || 0}`).join(", ") });
    shown.forEach((k, i) => track.append(segment(k, i, byKind[k] || 0)));
    const reasoning = byKind.reasoning || 0;
    const thinking = el("div", { class: "track thin", role: "img", "aria-label": `reasoning ${reasoning} (within output)` }, segment("reasoning", 4, reasoning));
    const bar = el("div", { class: "bar minute" }, el("span", { class: "label", text: new Date(start * 1000).toISOString().slice(11, 16) + " UTC" }), el("div", { class: "tracks" }, track, thinking));
    for (const k of [...shown, "reasoning"]) bar.dataset[k.replace(/_(\w)/g, (_, c) => c.toUpperCase())] = String(byKind[k] || 0);
    series.append(bar);
  }
  const legend = el("ul", { class: "legend" }, ...shown.map((k, i) => el("li", {}, el("span", { class: "swatch kind-" + i, "aria-hidden": "true" }), k)),
    el("li", {}, el("span", { class: "swatch kind-4", "aria-hidden": "true" }), "reasoning (within output)"));
  series.append(legend);
  table("timeline", ["Minute (UTC)", ...kinds], perBucket.map(([start, k]) => [new Date(start * 1000).toISOString().slice(0, 16), ...kinds.map((x) => k[x] || 0)]),
    [false, ...kinds.map(() => true)]);
  status(`${data.timeline.usage.length} minute(s) of history in this process.`);
}

// --- decisions ----------------------------------------------------------------------------

async function decisionsPage() {
  const data = await api("/ui/api/decisions");
  const byReason = {}, byRoute = {}, byProfile = {};
  const add = (map, key, decision, n) => {
    map[key] = map[key] || { allow: 0, block: 0, withhold: 0 };
    map[key][decision] = (map[key][decision] || 0) + n;
  };
  for (const bucket of data.decisions) {
    for (const c of bucket.counts) {
      add(byReason, c.phase + " · " + c.reason, c.decision, c.count);
      add(byRoute, c.route, c.decision, c.count);
      add(byProfile, c.profile, c.decision, c.count);
    }
  }
  const rowsOf = (map) => Object.keys(map).sort().map((k) => [k, map[k].allow, map[k].block, map[k].withhold]);
  const num = [false, true, true, true];
  table("by-reason", ["Phase · reason code", "allow", "block", "withhold"], rowsOf(byReason), num);
  table("by-route", ["Route", "allow", "block", "withhold"], rowsOf(byRoute), num);
  table("by-profile", ["Profile", "allow", "block", "withhold"], rowsOf(byProfile), num);
  table("over-time", ["Minute (UTC)", "allow", "block", "withhold"], data.decisions.map((b) => {
    const t = { allow: 0, block: 0, withhold: 0 };
    for (const c of b.counts) t[c.decision] += c.count;
    return [new Date(b.start * 1000).toISOString().slice(0, 16), t.allow, t.block, t.withhold];
  }), num);
  status(`${data.decisions.length} minute(s) of history in this process.`);
}

// --- sign in --------------------------------------------------------------------------------

function loginPage() {
  const form = document.getElementById("login-form");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const input = document.getElementById("key");
    const response = await fetch("/ui/login", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key: input.value }),
    });
    input.value = "";
    if (response.ok) window.location.assign("/ui/context.html");
    else document.getElementById("login-status").textContent = "Not signed in: the key is unknown or may not observe.";
  });
  // The form has no named field and its button stays disabled until this script has taken
  // over the submit: a key can never end up in a URL or a form post.
  document.getElementById("sign-in").disabled = false;
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "login") return loginPage();
  const pages = { context: contextPage, usage: usagePage, decisions: decisionsPage };
  header()
    .then(() => pages[page]())
    .then(() => (document.body.dataset.ready = "true"))
    .catch((err) => status(err.message));
});
