// One judgement's page: its record (`GET /judgements/{id}`), its trail, the end of its
// session log (`GET /judgements/{id}/log`) when one is kept, and retry / cancel. Text only.
"use strict";

const FINISHED = ["answered", "needs-triage", "failed", "cancelled"];
const STAMPED = new Set(["created_at", "updated_at"]);

function jid() {
  return decodeURIComponent(location.pathname.split("/").filter(Boolean).pop() || "");
}

function renderRecord(r) {
  const dl = document.getElementById("record");
  dl.replaceChildren();
  for (const [key, value] of Object.entries(r)) {
    if (key === "trail") continue;
    const dd = el("dd");
    dd.appendChild(STAMPED.has(key) ? stamp(value) : el("span", show(value)));
    dl.append(el("dt", key), dd);
  }
  const body = document.querySelector("#trail tbody");
  body.replaceChildren(...(r.trail || []).map((t) => {
    const tr = el("tr");
    const at = el("td");
    at.appendChild(stamp(t.at));
    tr.append(at, el("td", show(t.tier)), el("td", show(t.outcome)), el("td", show(t.why)));
    return tr;
  }));
  const actions = document.getElementById("judgement-actions");
  actions.replaceChildren();
  const path = `../actions/judgements/${encodeURIComponent(r.id)}`;
  if (r.status !== "queued" && r.status !== "running") {
    actions.appendChild(actionButton("Retry", () => act(`${path}/retry`, {}, (a) => `re-queued ${a.id}`).then(load)));
  }
  if (!FINISHED.includes(r.status)) {
    actions.appendChild(actionButton("Cancel", () => act(`${path}/cancel`, {}, (a) => `cancelled ${a.id}`).then(load)));
  }
}

async function loadLog(r) {
  const note = document.getElementById("log-note");
  const pre = document.getElementById("session-log");
  if (!r.session_log) {
    note.textContent = "No session log is kept for this judgement on this host (no session ran here, or it said nothing).";
    pre.hidden = true;
    return;
  }
  const response = await fetch(`../judgements/${encodeURIComponent(r.id)}/log`, { cache: "no-store", credentials: "same-origin" });
  note.textContent = response.ok ? `The end of ${r.session_log}` : `The session log could not be read (${response.status}).`;
  pre.textContent = response.ok ? await response.text() : "";
  pre.hidden = !response.ok;
}

async function load() {
  const error = document.getElementById("error");
  const id = jid();
  document.getElementById("jid").textContent = id;
  document.title = `dispatchq · ${id}`;
  try {
    const response = await fetch(`../judgements/${encodeURIComponent(id)}`, { cache: "no-store", credentials: "same-origin" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || `answered ${response.status}`);
    renderRecord(data);
    await loadLog(data);
    error.hidden = true;
  } catch (e) {
    error.textContent = `Could not read judgement ${id}: ${e.message}`;
    error.hidden = false;
  }
}

document.addEventListener("DOMContentLoaded", load);
