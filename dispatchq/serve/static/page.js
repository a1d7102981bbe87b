// The status page: fetch `status` every few seconds, build the DOM with textContent only.
// Text from issues, comments and payloads is data: it is never parsed as HTML here.
// The helpers (el, show, stamp, idLink, act) are common.js's.
"use strict";

const REFRESH_MS = 5000;
const HISTORY_MS = 60000;
let skew = 0; // server clock minus this browser's, in seconds (countdowns use the server's)

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

function judgementActions(r) {
  const td = el("td");
  const finished = ["answered", "needs-triage", "failed", "cancelled"].includes(r.status);
  if (r.status !== "queued" && r.status !== "running") {
    td.appendChild(actionButton("retry", () => act(`actions/judgements/${encodeURIComponent(r.id)}/retry`, {},
      (a) => `re-queued ${a.id}`).then(refresh)));
  }
  if (!finished) {
    td.appendChild(actionButton("cancel", () => act(`actions/judgements/${encodeURIComponent(r.id)}/cancel`, {},
      (a) => `cancelled ${a.id}`).then(refresh)));
  }
  return td;
}

function summaryPart(label, value) {
  const span = el("span", `${label} `, "summary-part");
  span.appendChild(el("strong", String(value || 0)));
  span.dataset.part = label;
  return span;
}

// The header: every count a person asks first, the answered ones per tier.
function renderSummary(data) {
  const j = data.judgements || {};
  const answered = data.answered || {};
  const box = document.getElementById("summary");
  box.className = "";
  box.replaceChildren(
    el("span", `redis ${data.redis} · `, "muted"),
    ...["code", "typed", "session"].map((t) => summaryPart(`answered by ${t}`, answered[t])),
    summaryPart("queued", j.queued), summaryPart("running", j.running), summaryPart("waiting", j.waiting),
    summaryPart("failed", j.failed), summaryPart("needs-triage", j["needs-triage"]),
    summaryPart("cancelled", j.cancelled),
    el("span", "updated ", "muted"), stamp(Date.now() / 1000),
  );
}

// Red facts (`status`'s `warnings`: no worker for what is queued, the scheduler down, ...),
// each with its hint; whatever ids and texts the server sends, shown as text.
function renderWarnings(data) {
  const list = document.getElementById("warnings");
  const warnings = Array.isArray(data.warnings) ? data.warnings : [];
  list.replaceChildren(...warnings.map((w) => {
    const li = el("li", show(w.text));
    li.dataset.id = String(w.id || "");
    if (w.hint) li.appendChild(el("span", w.hint, "hint"));
    return li;
  }));
  list.hidden = !warnings.length;
}

function render(data) {
  skew = typeof data.now === "number" ? data.now - Date.now() / 1000 : 0;
  renderSummary(data);
  renderWarnings(data);

  const markers = data.markers || [];
  const scopes = markers.map((m) => {
    const state = scopeState(m);
    return [
      el("td", m.scope), el("td", state, `state state-${state}`), stamp(m.lifts_at_epoch),
      m.up ? countdown(m.lifts_at_epoch) : el("td", "–"), el("td", show(m.kind)), el("td", show(m.message)),
      el("td", show(m.session)), el("td", m.utilization === null || m.utilization === undefined ? "–" : `${Math.round(m.utilization * 100)}%`),
    ];
  });
  if (!markers.length) scopes.push([el("td", "general"), el("td", "open", "state state-open"), "–", "–", "–", "no marker", "–", "–"]);
  fill("scopes", scopes);

  renderUsage(data);
  renderPool(data);

  const retrigger = document.getElementById("retrigger");
  retrigger.replaceChildren();
  if (data.retrigger) {
    const at = Date.parse(data.retrigger) / 1000;
    retrigger.append("Next retrigger: ", stamp(at), " (in ", countdown(at), ")");
  } else {
    retrigger.textContent = "No retrigger scheduled.";
  }
  const sessions = data.sessions || {};
  fill("hosts", Object.entries(sessions.blocked || {}).map(([host, why]) => [host, why,
    actionButton("unblock", () => act("actions/hosts/unblock", { host }, (a) =>
      a.was_blocked ? `host ${a.host}: sessions unblocked` : `host ${a.host} was not blocked`).then(refresh)),
  ]), "no host blocked");

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
    idLink(r.id), r.kind, r.target, r.item, r.reason, stamp(r.updated_at), judgementActions(r),
  ]), "nothing waits");

  fill("latest", (data.latest || []).map((r) => [
    idLink(r.id), r.kind, r.target, r.item, r.status, r.tier, r.value, r.reason, stamp(r.updated_at),
    judgementActions(r),
  ]), "no judgements yet");

  const t = data.triage || {};
  const counts = Object.entries(t.counts || {}).map(([k, n]) => `${k} ${n}`).join(", ");
  document.getElementById("triage-summary").textContent = t.runs
    ? `Last ${t.runs} runs: ${counts || "nothing planned"} · ${t.needs_triage || 0} marked needs-triage`
    : "No triage runs yet.";
  fill("suppressed", (t.suppressed || []).map((s) => [
    s.target, s.event, s.rule, s.action, s.reason, s.explanation, s.confidence, s.threshold, s.margin,
  ]), "nothing suppressed in shadow mode");

  fill("audit", (data.window_audit || []).map((a) => [stamp(a.at), a.scope, a.action, a.who, a.reason]), "no changes");
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
    stamp(u.resets_at_epoch),
    u.resets_at_epoch ? countdown(u.resets_at_epoch) : el("td", "–"),
    el("td", ago(u.age_seconds)),
    short(u.session),
  ]), "no session has reported the window's use yet");
  const warnings = (data.credentials || []).filter((c) => c.warning).map((c) => `WARNING: ${c.warning}`);
  const box = document.getElementById("credential-warnings");
  box.textContent = warnings.join(" · ");
  box.hidden = !warnings.length;
}

function dollars(spent, cap) {
  const amount = (n) => `$${Number(n || 0).toFixed(2)}`;
  return typeof cap === "number" ? `${amount(spent)} of ${amount(cap)}` : amount(spent);
}

// Each credential of the pool: its state and why, its sessions against its slots, each window
// its sessions reported (with the report's age), its spend against its caps; then the
// backlog's estimated drain (`status`'s `pool` and `backlog`).
function renderPool(data) {
  const pool = data.pool || {};
  fill("pool", (pool.credentials || []).map((c) => {
    const spend = c.spend || {};
    const windows = (c.windows || []).map((w) =>
      `${w.window} ${typeof w.utilization === "number" ? `${Math.round(w.utilization * 100)}%` : "–"}` +
      ` (${ago(w.age_seconds)})`).join(" · ");
    return [
      el("td", c.name), el("td", c.billing), el("td", c.state, `state state-${c.state}`), el("td", show(c.why)),
      el("td", `${c.running || 0} of ${c.concurrency || 0}`, "num"), el("td", windows || "–"),
      el("td", dollars(spend.day, spend.cap_day), "num"), el("td", dollars(spend.month, spend.cap_month), "num"),
    ];
  }), "no credential");
  const backlog = data.backlog || {};
  document.getElementById("backlog").textContent = `Session backlog: ${show(backlog.drain_text)}`;
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

// `2h30m` goes as it is; `18:00` is the next such local time, sent with this browser's offset.
function untilValue(text) {
  const clock = /^(\d{1,2}):(\d{2})$/.exec(text.trim());
  if (!clock) return text.trim();
  const at = new Date();
  at.setHours(Number(clock[1]), Number(clock[2]), 0, 0);
  if (at <= new Date()) at.setDate(at.getDate() + 1);
  const offset = -at.getTimezoneOffset();
  const sign = offset >= 0 ? "+" : "-";
  const pad = (n) => String(Math.floor(Math.abs(n))).padStart(2, "0");
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:` +
    `${pad(at.getMinutes())}:00${sign}${pad(offset / 60)}:${pad(offset % 60)}`;
}

function wireWindowActions() {
  document.getElementById("close-window").addEventListener("click", () => {
    const body = {
      until: untilValue(document.getElementById("close-until").value),
      reason: document.getElementById("close-reason").value,
      force: document.getElementById("close-force").checked,
    };
    act("actions/window/close", body, (a) => `window closed until ${localText(a.closed_until_epoch)}`).then(refresh);
  });
  document.getElementById("open-window").addEventListener("click", () => {
    act("actions/window/open", {}, (a) =>
      a.opened.length ? `opened: ${a.opened.join(", ")}` : "the window was already open").then(refresh);
  });
}

// Ends this browser's login on every server (its id is dropped from the store), then shows
// the form again. Without a token there is no login, and the page simply reloads.
function wireLogout() {
  document.getElementById("logout").addEventListener("click", async () => {
    try {
      await fetch("logout", { method: "POST", credentials: "same-origin", cache: "no-store" });
    } finally {
      location.reload();
    }
  });
}

async function refreshHistory() {
  try {
    const response = await fetch("history", { cache: "no-store", credentials: "same-origin" });
    if (response.ok) drawHistory(document.getElementById("history"), await response.json());
  } catch (e) {
    // The chart keeps its last drawing; the status line says when the server is away.
  }
}

document.addEventListener("DOMContentLoaded", () => {
  wireWindowActions();
  wireLogout();
  refresh();
  refreshHistory();
  setInterval(refresh, REFRESH_MS);
  setInterval(refreshHistory, HISTORY_MS);
  setInterval(tick, 1000);
});
