// Operations (SPEC part 9): health components, SLO figures, and live sparklines of request
// rate, 5xx error rate and event rate. The rates are differences of the service's own
// Prometheus counters (svc_http_requests_total, svc_event_total) between two reads of
// /metrics a few seconds apart, so the chart shows what a Prometheus rate() would.
import { html, useState, useEffect, useRef } from "../vendor/preact-htm.module.js";
import { api, token } from "../api.js";
import { StatusBadge, ErrorBox, Sparkline } from "../components.js";

const POLL_MS = 3000;
const POINTS = 40;
// Label values are quoted and may hold `}` (route templates: path="/api/v1/memory/{agent_id}").
const SAMPLE = /^(svc_http_requests_total|svc_event_total)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+([0-9.eE+-]+)$/;

// Sums of the two counters, and of the requests that answered 5xx.
export function counters(text) {
  const out = { requests: 0, errors: 0, events: 0 };
  for (const line of text.split("\n")) {
    const m = SAMPLE.exec(line.trim());
    if (!m) continue;
    const value = Number(m[3]);
    if (m[1] === "svc_event_total") out.events += value;
    else {
      out.requests += value;
      if (/status="5\d\d"/.test(m[2] || "")) out.errors += value;
    }
  }
  return out;
}

// /health answers 503 with the same body when degraded: read the body whatever the status.
async function raw(path) {
  const t = token();
  const r = await fetch(`/api/v1${path}`, { headers: t ? { Authorization: `Bearer ${t}` } : {} });
  return r;
}

function Rate({ label, testid, values, unit }) {
  const last = values.length ? values[values.length - 1] : null;
  return html`<div class="card rate" data-testid=${testid}>
    <h4>${label}</h4>
    <p class="figure" data-testid=${`${testid}-value`}>${last === null ? "—" : `${last.toFixed(2)} ${unit}`}</p>
    <${Sparkline} values=${values} />
  </div>`;
}

export default function Page() {
  const [health, setHealth] = useState(null);
  const [slo, setSlo] = useState(null);
  const [series, setSeries] = useState({ requests: [], errors: [], events: [] });
  const [error, setError] = useState(null);
  const previous = useRef(null);

  useEffect(() => {
    let live = true;
    const push = (list, value) => [...list, value].slice(-POINTS);
    const tick = async () => {
      try {
        const [h, s, m] = await Promise.all([raw("/health"), api("GET", "/slo"), raw("/metrics")]);
        const body = await h.json();
        const now = performance.now();
        const c = counters(await m.text());
        if (!live) return;
        setHealth(body);
        setSlo(s);
        setError(null);
        const before = previous.current;
        previous.current = { at: now, ...c };
        if (before) {
          const dt = (now - before.at) / 1000;
          const requests = Math.max(0, c.requests - before.requests);
          const errors = Math.max(0, c.errors - before.errors);
          setSeries((old) => ({
            requests: push(old.requests, requests / dt),
            errors: push(old.errors, requests ? (100 * errors) / requests : 0),
            events: push(old.events, Math.max(0, c.events - before.events) / dt),
          }));
        }
      } catch (e) {
        if (live) setError(e);
      }
    };
    tick();
    const timer = setInterval(tick, POLL_MS);
    return () => { live = false; clearInterval(timer); };
  }, []);

  const components = health ? Object.entries(health.components) : [];
  return html`<div class="ops-page">
    <h2>Operations</h2>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${health && html`<section class="card" data-testid="ops-health">
      <h3>Health <span data-testid="ops-status"><${StatusBadge} status=${health.status} /></span></h3>
      <p class="muted">Version ${health.version}; up ${Math.round(health.uptime_seconds)} s</p>
      <table class="table"><thead><tr><th>Component</th><th>Status</th><th>Detail</th></tr></thead>
        <tbody>${components.map(([name, c]) => html`<tr key=${name}
          data-testid=${`ops-component-${name}`}>
          <td>${name}</td>
          <td>${c.status ? html`<${StatusBadge} status=${c.status} />` : ""}</td>
          <td>${Object.entries(c).filter(([k]) => k !== "status")
            .map(([k, v]) => `${k} ${v}`).join(", ")}</td></tr>`)}</tbody></table>
    </section>`}
    ${slo && html`<section class="card" data-testid="ops-slo"><h3>Service level objectives</h3>
      <table class="table"><thead><tr><th>Objective</th><th>Target</th><th>Current</th>
        <th>Met</th></tr></thead><tbody>
        ${Object.entries(slo).map(([name, e]) => html`<tr key=${name}
          data-testid=${`ops-slo-${name}`}>
          <td>${name}</td><td>${e.target}</td><td>${e.current}</td>
          <td><${StatusBadge} status=${e.compliant ? "ok" : "failed"} /></td></tr>`)}
      </tbody></table></section>`}
    <section class="grid">
      <${Rate} label="Requests" testid="ops-rate-requests" values=${series.requests} unit="/s" />
      <${Rate} label="5xx errors" testid="ops-rate-errors" values=${series.errors} unit="%" />
      <${Rate} label="Events" testid="ops-rate-events" values=${series.events} unit="/s" />
    </section>
  </div>`;
}
