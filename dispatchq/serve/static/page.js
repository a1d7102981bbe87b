// The status page: fetch `status` every few seconds, build the DOM with textContent only.
// Text from issues, comments and payloads is data: it is never parsed as HTML here.
"use strict";

const REFRESH_MS = 5000;
let skew = 0; // server clock minus this browser's, in seconds (countdowns use the server's)

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function fill(tableId, rows, empty) {
  const body = document.querySelector(`#${tableId} tbody`);
  const cols = document.querySelectorAll(`#${tableId} thead th`).length;
  body.replaceChildren();
  if (!rows.length) {
    const tr = el("tr", null, "empty");
    const td = el("td", empty || "none");
    td.colSpan = cols;
    tr.appendChild(td);
    body.appendChild(tr);
    return;
  }
  for (const cells of rows) {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.appendChild(cell instanceof Node ? wrap(cell) : el("td", show(cell)));
    body.appendChild(tr);
  }
}

function wrap(node) {
  if (node.tagName === "TD") return node;
  const td = document.createElement("td");
  td.appendChild(node);
  return td;
}

function num(value) {
  return el("td", value === undefined || value === null ? "0" : String(value), "num");
}

function show(value) {
  if (value === undefined || value === null || value === "") return "–";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function local(epochSeconds) {
  if (!epochSeconds) return "–";
  return new Date(epochSeconds * 1000).toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    timeZoneName: "short",
  });
}

function countdown(epochSeconds) {
  const span = el("span", "", "countdown");
  span.dataset.until = String(epochSeconds);
  tickOne(span);
  return span;
}

function tickOne(span) {
  const left = Math.max(0, Math.round(Number(span.dataset.until) - (Date.now() / 1000 + skew)));
  const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
  span.textContent = `${h}h ${String(m).padStart(2, "0")}m ${String(s).padStart(2, "0")}s`;
}

function tick() {
  for (const span of document.querySelectorAll(".countdown")) tickOne(span);
}

function scopeState(m) {
  if (!m.up) return m.state || "probing";
  return m.kind === "operator" || m.source === "reserve" ? "reserved" : "closed";
}

function short(id) {
  const code = el("code", String(id || "").slice(0, 12));
  code.title = String(id || "");
  return code;
}

function render(data) {
  skew = typeof data.now === "number" ? data.now - Date.now() / 1000 : 0;
  const j = data.judgements || {};
  document.getElementById("summary").textContent =
    `redis ${data.redis} · ${j.queued || 0} queued, ${j.running || 0} running, ${j.waiting || 0} waiting, ` +
    `${j.answered || 0} answered · updated ${new Date().toLocaleTimeString()}`;

  const markers = data.markers || [];
  const scopes = markers.map((m) => {
    const state = scopeState(m);
    return [
      el("td", m.scope), el("td", state, `state state-${state}`), el("td", local(m.lifts_at_epoch)),
      m.up ? countdown(m.lifts_at_epoch) : el("td", "–"), el("td", show(m.kind)), el("td", show(m.message)),
      el("td", show(m.session)), el("td", m.utilization === null || m.utilization === undefined ? "–" : `${Math.round(m.utilization * 100)}%`),
    ];
  });
  if (!markers.length) scopes.push([el("td", "general"), el("td", "open", "state state-open"), "–", "–", "–", "no marker", "–", "–"]);
  fill("scopes", scopes);

  renderUsage(data);

  const retrigger = document.getElementById("retrigger");
  retrigger.replaceChildren();
  if (data.retrigger) {
    const at = Date.parse(data.retrigger) / 1000;
    retrigger.append("Next retrigger: ", el("strong", local(at)), " (in ", countdown(at), ")");
  } else {
    retrigger.textContent = "No retrigger scheduled.";
  }
  const sessions = data.sessions || {};
  fill("hosts", Object.entries(sessions.blocked || {}).map(([host, why]) => [host, why]), "no host blocked");

  const byTier = data.judgements_by_tier || {};
  fill("tiers", ["code", "typed", "session"].map((t) => [
    el("td", t), num((data.queues || {})[t]), num((data.workers || {})[t]), num((byTier[t] || {}).running),
    num((byTier[t] || {}).waiting), num((data.answered || {})[t]),
  ]));
  document.getElementById("sessions").textContent =
    `Sessions avoided: ${data.sessions_avoided || 0} · spawned ${sessions.spawned || 0} · ` +
    `refused at spawn ${sessions.refused_at_spawn || 0} · running now ${Object.keys(sessions.running || {}).length}`;

  fill("waiting-classes", Object.entries(data.waiting_by_class || {}).filter(([, n]) => n).map(([c, n]) => [c, num(n)]), "nothing waits");
  const reasons = Object.entries(data.waiting || {}).map(([r, n]) => [r, num(n)]);
  const more = (data.waiting_reasons_distinct || 0) - reasons.length;
  if (more > 0) reasons.push([`… and ${more} other reason(s)`, el("td", "", "num")]);
  fill("waiting-reasons", reasons, "nothing waits");
  fill("waiting-sample", (data.waiting_sample || []).map((r) => [
    short(r.id), r.kind, r.target, r.item, r.reason, local(r.updated_at),
  ]), "nothing waits");

  fill("latest", (data.latest || []).map((r) => [
    short(r.id), r.kind, r.target, r.item, r.status, r.tier, r.value, r.reason, local(r.updated_at),
  ]), "no judgements yet");

  const t = data.triage || {};
  const counts = Object.entries(t.counts || {}).map(([k, n]) => `${k} ${n}`).join(", ");
  document.getElementById("triage-summary").textContent = t.runs
    ? `Last ${t.runs} runs: ${counts || "nothing planned"} · ${t.needs_triage || 0} marked needs-triage`
    : "No triage runs yet.";
  fill("suppressed", (t.suppressed || []).map((s) => [
    s.target, s.event, s.rule, s.action, s.reason, s.explanation, s.confidence, s.threshold, s.margin,
  ]), "nothing suppressed in shadow mode");

  fill("audit", (data.window_audit || []).map((a) => [a.at, a.scope, a.action, a.who, a.reason]), "no changes");
}

function ago(seconds) {
  if (typeof seconds !== "number") return "–";
  if (seconds < 120) return `${seconds}s ago`;
  return seconds < 7200 ? `${Math.floor(seconds / 60)}m ago` : `${Math.floor(seconds / 3600)}h ago`;
}

// Each window's use and reset as the sessions last reported it, with its age; a host whose
// stored login ends within a week is a WARNING above it.
function renderUsage(data) {
  fill("usage", (data.window_usage || []).map((u) => [
    el("td", u.scope),
    el("td", typeof u.utilization === "number" ? `${Math.round(u.utilization * 100)}%` : "–", "num usage-used"),
    el("td", local(u.resets_at_epoch)),
    u.resets_at_epoch ? countdown(u.resets_at_epoch) : el("td", "–"),
    el("td", ago(u.age_seconds)),
    short(u.session),
  ]), "no session has reported the window's use yet");
  const warnings = (data.credentials || []).filter((c) => c.warning).map((c) => `WARNING: ${c.warning}`);
  const box = document.getElementById("credential-warnings");
  box.textContent = warnings.join(" · ");
  box.hidden = !warnings.length;
}

async function refresh() {
  const error = document.getElementById("error");
  try {
    const response = await fetch("status", { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(`status answered ${response.status}`);
    render(await response.json());
    error.hidden = true;
  } catch (e) {
    error.textContent = `Could not read status: ${e.message} (retrying)`;
    error.hidden = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(refresh, REFRESH_MS);
  setInterval(tick, 1000);
});
