// Shared components. Everything user-supplied is passed as a text child or an attribute value
// (Preact escapes both); nothing here sets innerHTML.
import { html, useState } from "./vendor/preact-htm.module.js";

export { html };

// Table({columns: [{key, label, render?(row)}], rows, rowKey?(row), testid?, empty?})
export function Table({ columns, rows, rowKey, testid, empty }) {
  if (!rows || rows.length === 0) return html`<${Empty} text=${empty || "Nothing here yet."} />`;
  return html`<table class="table" data-testid=${testid}>
    <thead>
      <tr>${columns.map((c) => html`<th key=${c.key}>${c.label}</th>`)}</tr>
    </thead>
    <tbody>
      ${rows.map(
        (row, i) => html`<tr key=${rowKey ? rowKey(row) : i} data-testid=${testid ? `${testid}-row` : undefined}>
          ${columns.map((c) => html`<td key=${c.key}>${c.render ? c.render(row) : text(row[c.key])}</td>`)}
        </tr>`,
      )}
    </tbody>
  </table>`;
}

function text(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

const STATUS_CLASS = {
  completed: "ok", ready: "ok", running: "busy", started: "busy", starting: "busy",
  pending: "idle", paused: "idle", skipped: "idle", stopped: "idle",
  failed: "bad", error: "bad", cancelled: "warn", cancelling: "warn", compensating: "warn",
  open: "bad", half_open: "warn", closed: "ok",
};

// StatusBadge({status, testid?})
export function StatusBadge({ status, testid }) {
  const s = String(status ?? "unknown");
  return html`<span class=${`badge badge-${STATUS_CLASS[s] || "idle"}`} data-testid=${testid}>${s}</span>`;
}

// Time({ms}) - unix ms (or seconds, or an ISO string): relative text, the ISO time as title.
export function Time({ ms }) {
  if (ms === null || ms === undefined || ms === "") return html`<span class="muted">-</span>`;
  let t = typeof ms === "number" ? ms : Date.parse(ms);
  if (typeof ms === "number" && ms < 1e11) t = ms * 1000; // seconds
  if (Number.isNaN(t)) return html`<span>${String(ms)}</span>`;
  const d = new Date(t);
  return html`<time datetime=${d.toISOString()} title=${d.toISOString()}>${relative(t)}</time>`;
}

export function relative(t) {
  const s = Math.round((t - Date.now()) / 1000);
  const a = Math.abs(s);
  const [n, unit] =
    a < 60 ? [a, "s"] : a < 3600 ? [Math.round(a / 60), "min"] : a < 86400 ? [Math.round(a / 3600), "h"] : [Math.round(a / 86400), "d"];
  if (a < 2) return "now";
  return s < 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}

// Duration({ms})
export function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

// Json({value, testid?}) - a <pre> of the JSON text (as text: never markup).
export function Json({ value, testid }) {
  const s = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return html`<pre class="json" data-testid=${testid}>${s}</pre>`;
}

// Button({onClick, confirm?, kind?: "danger"|"primary", disabled?, testid?, children})
// With `confirm`, the first click asks (inline, no window.confirm) and the second acts.
export function Button({ onClick, confirm, kind, disabled, testid, children, type }) {
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  const run = async (e) => {
    if (confirm && !asking) {
      setAsking(true);
      return;
    }
    setAsking(false);
    setBusy(true);
    try {
      await onClick(e);
    } finally {
      setBusy(false);
    }
  };
  return html`<span class="button-wrap">
    <button type=${type || "button"} class=${`btn ${kind ? `btn-${kind}` : ""}`} disabled=${disabled || busy}
      onClick=${run} data-testid=${testid}>${asking ? `${confirm} - click again` : children}</button>
    ${asking && html`<button type="button" class="btn btn-link" onClick=${() => setAsking(false)}
      data-testid=${testid ? `${testid}-no` : undefined}>no</button>`}
  </span>`;
}

// Empty({text})
export function Empty({ text }) {
  return html`<p class="empty" data-testid="empty">${text || "Nothing here yet."}</p>`;
}

// ErrorBox({error}) - an ApiError (or Error, or text), with the request id to quote.
export function ErrorBox({ error }) {
  if (!error) return null;
  const msg = typeof error === "string" ? error : error.message;
  return html`<div class="error-box" role="alert" data-testid="error-box">
    <strong>${error.code ? `${error.code}: ` : ""}</strong>${msg}
    ${error.requestId && html`<span class="muted"> (request ${error.requestId})</span>`}
  </div>`;
}

// Sparkline({values, width?, height?, label?, testid?}) - a small SVG line of numbers.
export function Sparkline({ values, width = 160, height = 36, label, testid }) {
  const v = (values || []).filter((x) => typeof x === "number" && Number.isFinite(x));
  const max = Math.max(1e-9, ...v);
  const min = Math.min(0, ...v);
  const step = v.length > 1 ? width / (v.length - 1) : width;
  const pts = v.map((x, i) => `${(i * step).toFixed(1)},${(height - 2 - ((x - min) / (max - min || 1)) * (height - 4)).toFixed(1)}`);
  return html`<svg class="sparkline" width=${width} height=${height} viewBox=${`0 0 ${width} ${height}`}
    role="img" aria-label=${label || "chart"} data-testid=${testid}>
    ${pts.length > 1 && html`<polyline fill="none" points=${pts.join(" ")} />`}
  </svg>`;
}

// Field({label, children, hint?}) - a labelled form row; put the <input> in children.
export function Field({ label, hint, children }) {
  return html`<label class="field"><span class="field-label">${label}</span>${children}${hint && html`<small class="muted">${hint}</small>`}</label>`;
}

// Safe link targets only: internal `#/...` routes or http(s) URLs (never javascript: etc.).
export function safeHref(href) {
  const s = String(href || "");
  if (s.startsWith("#/")) return s;
  try {
    const u = new URL(s);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : "#/";
  } catch (_) {
    return "#/";
  }
}
