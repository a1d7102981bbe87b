// The 24-hour history (`GET /history`) as inline SVG built here: no library, no external asset.
// Per minute: answered per tier (stacked), sessions spawned and refused, the minutes the
// window was closed as bands, and the minutes no scheduler sampled as gaps: hatched, never
// drawn as zero.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHART = { width: 1000, top: 14, answered: 110, sessions: 60, gapBetween: 26, bottom: 18 };
const TIER_COLOURS = { code: "#2e90fa", typed: "#7a5af8", session: "#f79009" };
const SPAWNED = "#067647";
const REFUSED = "#b42318";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function titled(node, text) {
  node.appendChild(svg("title", {}, text));
  return node;
}

// [start, end) spans (epoch seconds) no sample covers: between samples, before the first, after the last.
function gapSpans(doc) {
  const spans = [];
  const rows = doc.series || [];
  rows.forEach((row, i) => {
    if (!row.gap) return;
    const next = rows[i + 1];
    spans.push([row.at - 60, next ? next.at - 60 : row.at]);
  });
  if (doc.first_sample === null || doc.first_sample === undefined) return [[doc.since, doc.now]];
  if (doc.first_sample > doc.since + 120) spans.unshift([doc.since, doc.first_sample]);
  if (doc.last_sample < doc.now - 120) spans.push([doc.last_sample, doc.now]);
  return spans;
}

function drawHistory(box, doc) {
  const c = CHART;
  const height = c.top + c.answered + c.gapBetween + c.sessions + c.bottom;
  const x = (t) => ((t - doc.since) / (doc.now - doc.since)) * c.width;
  const minute = c.width / 1440;
  const rows = (doc.series || []).filter((r) => !r.gap);
  const tiers = Object.keys(TIER_COLOURS);
  const answeredMax = Math.max(1, ...rows.map((r) => tiers.reduce((n, t) => n + (r[`answered:${t}`] || 0), 0)));
  const sessionsMax = Math.max(1, ...rows.map((r) => Math.max(r.spawned || 0, r.refused || 0)));
  const chart = svg("svg", { viewBox: `0 0 ${c.width} ${height}`, role: "img", "aria-label": "the last 24 hours" });
  const hatch = svg("pattern", { id: "gap-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
  hatch.appendChild(svg("rect", { width: 6, height: 6, fill: "#f2f4f7" }));
  hatch.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#d0d5dd", "stroke-width": 2 }));
  const defs = svg("defs");
  defs.appendChild(hatch);
  chart.appendChild(defs);
  const sessionsTop = c.top + c.answered + c.gapBetween;

  for (const r of rows) {
    if (!r.closed) continue;
    chart.appendChild(titled(svg("rect", {
      class: "closed", x: x(r.at - 60), y: c.top, width: minute, height: sessionsTop + c.sessions - c.top,
      fill: "#fec84b", "fill-opacity": 0.35,
    }), `window closed · ${localText(r.at)}`));
  }
  for (const [start, end] of gapSpans(doc)) {
    chart.appendChild(titled(svg("rect", {
      class: "gap", x: x(start), y: c.top, width: Math.max(minute, x(end) - x(start)),
      height: sessionsTop + c.sessions - c.top, fill: "url(#gap-hatch)",
    }), `no samples from ${localText(start)} to ${localText(end)} (no scheduler ran)`));
  }
  for (const r of rows) {
    let base = c.top + c.answered;
    for (const t of tiers) {
      const n = r[`answered:${t}`] || 0;
      if (!n) continue;
      const h = (n / answeredMax) * c.answered;
      base -= h;
      chart.appendChild(titled(svg("rect", { class: `answered answered-${t}`, x: x(r.at - 60), y: base, width: minute, height: h, fill: TIER_COLOURS[t] }),
        `${n} answered by ${t} · ${localText(r.at)}`));
    }
    for (const [name, colour, offset] of [["spawned", SPAWNED, 0], ["refused", REFUSED, minute / 2]]) {
      const n = r[name] || 0;
      if (!n) continue;
      const h = (n / sessionsMax) * c.sessions;
      chart.appendChild(titled(svg("rect", { class: `sessions-${name}`, x: x(r.at - 60) + offset, y: sessionsTop + c.sessions - h, width: minute / 2, height: h, fill: colour }),
        `${n} session(s) ${name} · ${localText(r.at)}`));
    }
  }
  const axis = { fill: "#667085", "font-size": 11 };
  chart.appendChild(svg("text", { ...axis, x: 0, y: c.top - 3 }, `answered per minute (max ${answeredMax})`));
  chart.appendChild(svg("text", { ...axis, x: 0, y: sessionsTop - 3 }, `sessions spawned and refused per minute (max ${sessionsMax})`));
  for (const line of [c.top + c.answered, sessionsTop + c.sessions]) {
    chart.appendChild(svg("line", { x1: 0, x2: c.width, y1: line, y2: line, stroke: "#d0d5dd" }));
  }
  for (let h = 24; h >= 0; h -= 6) {
    const at = doc.now - h * 3600;
    const label = h ? new Date(at * 1000).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" }) : "now";
    chart.appendChild(svg("text", { ...axis, x: Math.min(c.width - 24, x(at)), y: height - 4 }, label));
  }
  const legend = el("p", "", "legend muted");
  for (const [label, colour] of [...tiers.map((t) => [`answered by ${t}`, TIER_COLOURS[t]]),
    ["sessions spawned", SPAWNED], ["refused at spawn", REFUSED], ["window closed", "#fec84b"], ["no samples", "#d0d5dd"]]) {
    const swatch = el("span", "", "swatch");
    swatch.style.background = colour;
    legend.append(swatch, label);
  }
  box.replaceChildren(chart, legend);
}
