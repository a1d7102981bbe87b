// What the status page and a judgement's page share: DOM built with textContent only, one
// date format (local time shown, UTC in the title), and the actions' POST.
"use strict";

// The header a form cannot send: with the write cookie, the server takes a write only with it.
const WRITE_HEADER = "X-Dispatchq-Write";

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function show(value) {
  if (value === undefined || value === null || value === "") return "–";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// An instant as epoch seconds or ISO 8601, as seconds (NaN when it is neither).
function epochOf(value) {
  if (typeof value === "number") return value;
  if (typeof value === "string" && value) return Date.parse(value) / 1000;
  return NaN;
}

function localText(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    timeZoneName: "short",
  });
}

// Every date on the pages: local time as the text, UTC (ISO 8601) as the title.
function stamp(value) {
  const at = epochOf(value);
  if (!value || !Number.isFinite(at)) return el("span", "–");
  const node = el("time", localText(at), "stamp");
  node.dateTime = new Date(at * 1000).toISOString();
  node.title = `${node.dateTime.replace(/\.\d{3}Z$/, "Z")} (UTC)`;
  return node;
}

// Where the server's routes are, relative to this page (`<body data-base>`): "" or "../".
function base() {
  return document.body.dataset.base || "";
}

function idLink(id) {
  const a = el("a", String(id || "").slice(0, 12), "jid");
  a.href = `${base()}judgement/${encodeURIComponent(String(id || ""))}`;
  a.title = String(id || "");
  return a;
}

function say(text, ok) {
  const box = document.getElementById("action-result");
  if (!box) return;
  box.replaceChildren(el("span", text));
  box.className = ok ? "ok" : "bad";
  box.hidden = false;
}

// POST one action as JSON with the write header; the browser adds the HttpOnly write
// cookie (this script never sees it, nor the token). Says the outcome; resolves to the JSON.
async function act(url, body, done) {
  let answer = {};
  let status = 0;
  try {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Content-Type": "application/json", [WRITE_HEADER]: "1" },
      body: JSON.stringify(body || {}),
    });
    status = response.status;
    answer = await response.json().catch(() => ({}));
  } catch (e) {
    say(`the action failed: ${e.message}`, false);
    return null;
  }
  if (status === 401) {
    const box = document.getElementById("action-result");
    say("Your login to act has expired (it lasts 15 minutes). ", false);
    const again = el("a", "Log in again");
    again.href = `${base()}login`;
    box.appendChild(again);
    return null;
  }
  if (status >= 400) {
    say(`refused (${status}): ${answer.error || "no reason given"}`, false);
    return null;
  }
  say(done(answer), true);
  return answer;
}

function actionButton(label, onClick) {
  const button = el("button", label);
  button.type = "button";
  button.addEventListener("click", onClick);
  return button;
}
