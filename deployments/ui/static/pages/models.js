// Models and inference (SPEC part 4): the model catalog with provider and status; local
// llama.cpp instances with their state, started from a local model and stopped; provider
// health with circuit-breaker states (base URLs and error texts reach admins only: the API
// leaves them out for everyone else).
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, StatusBadge, Button, ErrorBox, Empty } from "../components.js";

const POLL_MS = 2000;

function Models({ models, user, onStart, onDiscover }) {
  return html`<section class="card">
    <h3>Models</h3>
    ${user.admin && html`<${Button} testid="models-discover" onClick=${onDiscover}>
      Discover local models<//>`}
    ${models.length === 0 ? html`<${Empty} text="No models" />`
      : html`<table class="table" data-testid="models-table"><thead><tr>
          <th>Name</th><th>Provider</th><th>Status</th><th>Context</th><th></th></tr></thead>
          <tbody>${models.map((m) => html`<tr key=${m.name} data-testid=${`model-row-${m.name}`}>
            <td>${m.name}</td><td>${m.provider}</td>
            <td data-testid=${`model-status-${m.name}`}><${StatusBadge} status=${m.status} /></td>
            <td>${m.ctx_size ?? "—"}</td>
            <td>${m.provider === "local" && html`<${Button} testid=${`model-start-${m.name}`}
              onClick=${() => onStart(m.name)}>Start instance<//>`}</td></tr>`)}
          </tbody></table>`}
  </section>`;
}

function Instances({ instances, onStop }) {
  return html`<section class="card">
    <h3>Local instances</h3>
    ${instances.length === 0 ? html`<${Empty} text="No instances" />`
      : html`<table class="table" data-testid="instances-table"><thead><tr>
          <th>Id</th><th>Model</th><th>State</th><th>Port</th><th>Started</th><th>Error</th>
          <th></th></tr></thead>
          <tbody>${instances.map((i) => html`<tr key=${i.id} data-testid=${`instance-row-${i.id}`}>
            <td>${i.id}</td><td>${i.model}</td>
            <td data-testid=${`instance-state-${i.id}`}><${StatusBadge} status=${i.state} /></td>
            <td>${i.port ?? "—"}</td><td><${Time} ms=${i.created_at} /></td>
            <td>${i.error ?? ""}</td>
            <td>${["starting", "ready", "running"].includes(i.state) && html`<${Button}
              testid=${`instance-stop-${i.id}`} onClick=${() => onStop(i.id)}>Stop<//>`}</td>
          </tr>`)}</tbody></table>`}
  </section>`;
}

function Providers({ health, user }) {
  const names = Object.keys(health.providers).sort();
  return html`<section class="card">
    <h3>Providers <span class="muted">${health.healthy} healthy of ${health.configured} configured</span></h3>
    <table class="table" data-testid="providers-table"><thead><tr>
      <th>Provider</th><th>Configured</th><th>Reachable</th><th>Breaker</th><th>Models</th>
      ${user.admin && html`<th>Base URL</th><th>Last error</th>`}</tr></thead>
      <tbody>${names.map((n) => {
        const p = health.providers[n];
        return html`<tr key=${n} data-testid=${`provider-row-${n}`}>
          <td>${n}</td><td>${p.configured ? "yes" : "no"}</td>
          <td>${p.reachable === null || p.reachable === undefined ? "—" : p.reachable ? "yes" : "no"}</td>
          <td data-testid=${`provider-breaker-${n}`}><${StatusBadge} status=${p.breaker} /></td>
          <td>${(p.models || []).join(", ")}</td>
          ${user.admin && html`<td>${p.base_url ?? "—"}</td>
            <td>${p.last_error ?? p.probe_error ?? "—"}</td>`}</tr>`;
      })}</tbody></table>
  </section>`;
}

export default function Page({ user }) {
  const [models, setModels] = useState(null);
  const [instances, setInstances] = useState([]);
  const [health, setHealth] = useState(null);
  const [error, setError] = useState(null);

  const refresh = useCallback(async () => {
    try {
      const [m, i, h] = await Promise.all([
        api("GET", "/models"), api("GET", "/inference"), api("GET", "/providers/health"),
      ]);
      setModels(m.models);
      setInstances(i.data);
      setHealth(h);
    } catch (e) {
      setError(e);
    }
  }, []);

  useEffect(() => {
    refresh();
    const timer = setInterval(refresh, POLL_MS);
    return () => clearInterval(timer);
  }, [refresh]);

  const run = (fn) => async (...args) => {
    setError(null);
    try {
      await fn(...args);
      await refresh();
    } catch (e) {
      setError(e);
    }
  };
  const start = run((model) => api("POST", "/inference", { body: { model } }));
  const stop = run((id) => api("POST", "/stop", { body: { id } }));
  const discover = run(() => api("POST", "/discover"));

  return html`<div class="models-page">
    <h2>Models and inference</h2>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${models === null ? html`<p class="muted">Loading…</p>` : html`
      <${Models} models=${models} user=${user} onStart=${start} onDiscover=${discover} />
      <${Instances} instances=${instances} onStop=${stop} />
      ${health && html`<${Providers} health=${health} user=${user} />`}`}
  </div>`;
}
