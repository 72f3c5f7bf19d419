// Memory (SPEC part 7), per agent id: the keys (newest first, paged), full-text search,
// vector search by text (needs pgvector and a configured embedder: the API says when not),
// pin and delete an entry. Values are untrusted text and shown as text.
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, Button, ErrorBox, Empty, Field } from "../components.js";

const PAGE = 50;

function Entries({ rows, agent, onDelete, onPin, testid, score }) {
  if (rows.length === 0) return html`<${Empty} text="Nothing found" />`;
  return html`<table class="table" data-testid=${testid}><thead><tr>
    <th>Key</th><th>Value</th>${score ? html`<th>Similarity</th>` : html`<th>Created</th>`}
    <th></th></tr></thead><tbody>
    ${rows.map((r) => html`<tr key=${r.key} data-testid="memory-entry" data-key=${r.key}>
      <td>${r.key}</td><td><pre class="value">${r.value}</pre></td>
      ${score ? html`<td>${r.similarity}</td>` : html`<td><${Time} ms=${r.created_at} /></td>`}
      <td class="actions">
        <${Button} testid=${`memory-pin-${r.key}`} onClick=${() => onPin(r.key)}>Pin<//>
        <${Button} testid=${`memory-delete-${r.key}`} kind="danger" confirm=${`Delete ${r.key} of ${agent}?`}
          onClick=${() => onDelete(r.key)}>Delete<//>
      </td></tr>`)}
  </tbody></table>`;
}

export default function Page({ user }) {
  const [agent, setAgent] = useState("default");
  const [draft, setDraft] = useState("default");
  const [stats, setStats] = useState(null);
  const [entries, setEntries] = useState(null);
  const [offset, setOffset] = useState(0);
  const [query, setQuery] = useState("");
  const [results, setResults] = useState(null);
  const [similar, setSimilar] = useState(null);
  const [notice, setNotice] = useState(null);
  const [error, setError] = useState(null);
  const base = `/memory/${encodeURIComponent(agent)}`;

  const refresh = useCallback(async () => {
    try {
      // The totals are across every user: the API gives them to admins only.
      const [s, l] = await Promise.all([
        user.admin ? api("GET", "/memory/stats") : null,
        api("GET", `${base}/list`, { query: { limit: PAGE, offset } }),
      ]);
      setStats(s);
      setEntries(l.entries);
    } catch (e) {
      setError(e);
    }
  }, [base, offset, user.admin]);
  useEffect(() => { refresh(); }, [refresh]);

  const guard = (fn) => async (...args) => {
    setError(null);
    setNotice(null);
    try {
      await fn(...args);
    } catch (e) {
      setError(e);
    }
  };
  const search = guard(async (ev) => {
    ev.preventDefault();
    setSimilar(null);
    setResults((await api("GET", `${base}/search`, { query: { q: query } })).results);
  });
  const vector = guard(async () => {
    setResults(null);
    const out = await api("POST", `${base}/vector-search`, { body: { text: query } });
    setSimilar(out.results);
  });
  const remove = guard(async (key) => {
    await api("DELETE", `${base}/${encodeURIComponent(key)}`);
    setNotice(`Deleted ${key}`);
    setResults(null);
    setSimilar(null);
    await refresh();
  });
  const pin = guard(async (key) => {
    await api("POST", `${base}/${encodeURIComponent(key)}/pin`, { body: { pinned: true } });
    setNotice(`Pinned ${key}: decay will not forget it`);
  });

  return html`<div class="memory-page">
    <h2>Memory</h2>
    ${stats && html`<p class="muted" data-testid="memory-stats">${stats.total_entries} entries over ${stats.total_agents} agents;
      ${" "}vector search ${stats.pgvector_enabled ? "available" : "unavailable (no pgvector)"}</p>`}
    <form class="toolbar" onSubmit=${(e) => { e.preventDefault(); setOffset(0); setAgent(draft); }}>
      <${Field} label="Agent"><input data-testid="memory-agent" value=${draft}
        onInput=${(e) => setDraft(e.target.value)} /><//>
      <button class="btn btn-primary" type="submit" data-testid="memory-open">Open</button>
    </form>
    <form class="toolbar" onSubmit=${search}>
      <input data-testid="memory-query" placeholder="Search" value=${query} required
        onInput=${(e) => setQuery(e.target.value)} />
      <button class="btn btn-primary" type="submit" data-testid="memory-search">Full-text search</button>
      <button class="btn" type="button" data-testid="memory-vector" onClick=${vector}>Vector search</button>
    </form>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${notice && html`<p class="notice" data-testid="memory-notice">${notice}</p>`}
    ${results && html`<h3>Full-text results</h3>
      <${Entries} rows=${results} agent=${agent} onDelete=${remove} onPin=${pin}
        testid="memory-results" />`}
    ${similar && html`<h3>Similar entries</h3>
      <${Entries} rows=${similar} agent=${agent} onDelete=${remove} onPin=${pin}
        testid="memory-similar" score=${true} />`}
    <h3>Keys of ${agent}</h3>
    ${entries === null ? html`<p class="muted">Loading…</p>` : html`
      <${Entries} rows=${entries} agent=${agent} onDelete=${remove} onPin=${pin}
        testid="memory-entries" />
      <div class="toolbar">
        <button class="btn" disabled=${offset === 0} data-testid="memory-prev"
          onClick=${() => setOffset(Math.max(0, offset - PAGE))}>Previous</button>
        <button class="btn" disabled=${entries.length < PAGE} data-testid="memory-next"
          onClick=${() => setOffset(offset + PAGE)}>Next</button>
      </div>`}
  </div>`;
}
