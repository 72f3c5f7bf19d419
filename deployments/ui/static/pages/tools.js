// Tools (issue 30): the MCP servers and HTTP tools the caller's agents can call, the tool
// policy (the user's rules; the global rules, editable by admins) and every tool by source.
// Server and tool names, descriptions and errors come from third parties: text only.
// Header and env values come back from the API as `***` and stay that way here.
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, StatusBadge, Button, ErrorBox, Empty, Json, Field } from "../components.js";

const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"];
const SOURCES = ["builtin", "memory", "workspace", "mcp", "http", "marketplace"];
const PARAMETERS = '{\n  "type": "object",\n  "properties": {}\n}';

// `Name: value` lines (or `NAME=value` with sep "=") as an object; blank lines skipped.
function parseLines(text, sep, what) {
  const out = {};
  (text || "").split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const at = line.indexOf(sep);
    if (at <= 0) throw new Error(`${what} line ${i + 1}: expected Name${sep === ":" ? ": " : "="}value`);
    out[line.slice(0, at).trim()] = line.slice(at + 1).replace(/^ /, "");
  });
  return out;
}

// GET `path` into state, with its error; `load` again after a change.
function useLoad(path, pick) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const load = useCallback(async () => {
    try {
      setData(pick(await api("GET", path)));
      setError(null);
    } catch (e) {
      setError(e);
    }
  }, [path]);
  useEffect(() => { load(); }, [load]);
  return { data, error, setError, load };
}

function Masked({ value }) {
  const names = Object.keys(value || {});
  return names.length ? html`<span class="muted">${names.map((n) => `${n}: ***`).join(", ")}</span>` : "";
}

const MCP_FORM = { name: "", transport: "streamable_http", url: "", headers: "", command: "", args: "", env: "", shared: false };
const HTTP_FORM = { name: "", description: "", method: "GET", url: "", parameters: PARAMETERS, headers: "" };

function McpForm({ user, onCreated }) {
  const [f, setF] = useState(MCP_FORM);
  const [busy, setBusy] = useState(false);
  const [created, setCreated] = useState(null);
  const [error, setError] = useState(null);
  const set = (k) => (e) => setF({ ...f, [k]: e.target.type === "checkbox" ? e.target.checked : e.target.value });
  const submit = async (ev) => {
    ev.preventDefault();
    setError(null);
    setCreated(null);
    setBusy(true);
    try {
      const body = { name: f.name };
      if (f.transport === "stdio") {
        body.command = f.command;
        body.args = f.args.split("\n").filter((a) => a !== "");
        body.env = parseLines(f.env, "=", "env");
      } else {
        body.url = f.url;
        body.headers = parseLines(f.headers, ":", "headers");
      }
      if (user.admin && f.shared) body.shared = true;
      const out = await api("POST", "/mcp/servers", { body });
      setCreated(out);
      setF(MCP_FORM); // the secrets typed leave the page
      onCreated();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  const stdio = f.transport === "stdio";
  return html`<form class="card" data-testid="mcp-create" onSubmit=${submit}>
    <h3>Register an MCP server</h3>
    <${Field} label="Name" hint="a-z 0-9 _ -; its tools are offered as mcp__<name>__<tool>">
      <input data-testid="mcp-name" required value=${f.name} onInput=${set("name")} /><//>
    ${user.admin && html`<${Field} label="Transport"><select data-testid="mcp-transport"
      value=${f.transport} onChange=${set("transport")}>
      <option value="streamable_http">streamable HTTP</option><option value="stdio">stdio (admins)</option></select><//>`}
    ${!stdio && html`<${Field} label="URL"><input data-testid="mcp-url" required value=${f.url}
      placeholder="https://mcp.example.com/mcp" onInput=${set("url")} /><//>
      <${Field} label="Headers" hint="one per line, Name: value (kept secret)"><textarea data-testid="mcp-headers"
        value=${f.headers} placeholder="Authorization: Bearer ..." onInput=${set("headers")}></textarea><//>`}
    ${stdio && html`<${Field} label="Command"><input data-testid="mcp-command" required value=${f.command}
      onInput=${set("command")} /><//>
      <${Field} label="Arguments" hint="one per line"><textarea data-testid="mcp-args" value=${f.args}
        onInput=${set("args")}></textarea><//>
      <${Field} label="Environment" hint="one per line, NAME=value (kept secret)"><textarea data-testid="mcp-env"
        value=${f.env} onInput=${set("env")}></textarea><//>`}
    ${user.admin && html`<label class="field"><span><input type="checkbox" data-testid="mcp-shared"
      checked=${f.shared} onChange=${set("shared")} /> Shared with every user</span></label>`}
    <button class="btn btn-primary" type="submit" disabled=${busy} data-testid="mcp-submit">
      ${busy ? "Connecting…" : "Register"}</button>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${created && html`<p class="notice" data-testid="mcp-created">Server ${created.name} (${created.id})
      registered: ${created.status}, ${(created.tools || []).length} tool(s).</p>`}
  </form>`;
}

function McpServers({ user, onChange }) {
  const { data, error, setError, load } = useLoad("/mcp/servers", (r) => r.servers);
  const act = (fn) => async () => {
    setError(null);
    try {
      await fn();
    } catch (e) {
      setError(e); // not reloaded: a reload's success would clear the error
      return;
    }
    await load();
    onChange();
  };
  return html`<section data-testid="mcp-section">
    <h2>MCP servers</h2>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${data === null ? html`<p class="muted">Loading…</p>`
      : data.length === 0 ? html`<${Empty} text="No MCP servers" />`
      : html`<table class="table" data-testid="mcp-servers"><thead><tr><th>Name</th><th>Transport</th>
          <th>Shared</th><th>Status</th><th>Tools</th><th>Updated</th><th></th></tr></thead><tbody>
          ${data.map((s) => html`<tr key=${s.id} data-testid=${`mcp-row-${s.id}`}>
            <td data-testid=${`mcp-name-${s.id}`}>${s.name}<div class="muted">${s.id}</div></td>
            <td>${s.transport}<div class="muted">${s.url ?? [s.command, ...(s.args || [])].join(" ")}</div>
              <${Masked} value=${s.headers || s.env} /></td>
            <td>${s.shared ? "shared" : "own"}</td>
            <td><${StatusBadge} status=${s.status} testid=${`mcp-status-${s.id}`} />
              ${s.status === "error" && html`<div class="error-box" data-testid=${`mcp-error-${s.id}`}>${s.error ?? ""}</div>`}</td>
            <td><details data-testid=${`mcp-tools-${s.id}`}><summary data-testid=${`mcp-tools-count-${s.id}`}>
              ${(s.tools || []).length} tool(s)</summary>
              <ul>${(s.tools || []).map((t) => html`<li key=${t.name} data-testid="mcp-tool"><code>${t.name}</code>
                <span class="muted"> ${t.description}</span></li>`)}</ul></details></td>
            <td><${Time} ms=${s.updated_at} /></td>
            <td class="actions">${(!s.shared || user.admin) && html`
              <${Button} testid=${`mcp-refresh-${s.id}`}
                onClick=${act(() => api("POST", `/mcp/servers/${encodeURIComponent(s.id)}/refresh`))}>Refresh<//>
              <${Button} testid=${`mcp-delete-${s.id}`} kind="danger" confirm="Delete this server?"
                onClick=${act(() => api("DELETE", `/mcp/servers/${encodeURIComponent(s.id)}`))}>Delete<//>`}</td>
          </tr>`)}
        </tbody></table>`}
    <${McpForm} user=${user} onCreated=${() => { load(); onChange(); }} />
  </section>`;
}

function HttpForm({ onCreated }) {
  const [f, setF] = useState(HTTP_FORM);
  const [created, setCreated] = useState(null);
  const [error, setError] = useState(null);
  const set = (k) => (e) => setF({ ...f, [k]: e.target.value });
  const submit = async (ev) => {
    ev.preventDefault();
    setError(null);
    setCreated(null);
    try {
      let parameters;
      try {
        parameters = JSON.parse(f.parameters || "{}");
      } catch (e) {
        throw new Error(`parameters is not JSON: ${e.message}`);
      }
      const headers = parseLines(f.headers, ":", "headers");
      const body = { name: f.name, description: f.description, method: f.method, url: f.url, parameters, headers };
      const out = await api("POST", "/tools/http", { body });
      setCreated(out);
      setF(HTTP_FORM);
      onCreated();
    } catch (e) {
      setError(e);
    }
  };
  return html`<form class="card" data-testid="http-create" onSubmit=${submit}>
    <h3>New HTTP tool</h3>
    <${Field} label="Name" hint="a-z 0-9 _ -; offered as http__<name>"><input data-testid="http-name" required
      value=${f.name} onInput=${set("name")} /><//>
    <${Field} label="Description" hint="what the model reads to decide when to call it">
      <input data-testid="http-description" required value=${f.description} onInput=${set("description")} /><//>
    <${Field} label="Method"><select data-testid="http-method" value=${f.method} onChange=${set("method")}>
      ${METHODS.map((m) => html`<option key=${m} value=${m}>${m}</option>`)}</select><//>
    <${Field} label="URL" hint="{param} placeholders are filled from the call's arguments"><input
      data-testid="http-url" required value=${f.url} placeholder="https://api.example.com/items/{id}"
      onInput=${set("url")} /><//>
    <${Field} label="Parameters (JSON Schema)"><textarea data-testid="http-parameters" rows="6" value=${f.parameters}
      onInput=${set("parameters")}></textarea><//>
    <${Field} label="Headers" hint="one per line, Name: value (kept secret)"><textarea data-testid="http-headers"
      value=${f.headers} onInput=${set("headers")}></textarea><//>
    <button class="btn btn-primary" type="submit" data-testid="http-submit">Create</button>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${created && html`<p class="notice" data-testid="http-created">Tool ${created.tool || `http__${created.name}`} created.</p>`}
  </form>`;
}

function HttpTools({ onChange }) {
  const { data, error, setError, load } = useLoad("/tools/http", (r) => r.tools);
  const remove = async (id) => {
    setError(null);
    try {
      await api("DELETE", `/tools/http/${encodeURIComponent(id)}`);
    } catch (e) {
      setError(e);
      return;
    }
    await load();
    onChange();
  };
  return html`<section data-testid="http-section">
    <h2>HTTP tools</h2>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${data === null ? html`<p class="muted">Loading…</p>`
      : data.length === 0 ? html`<${Empty} text="No HTTP tools" />`
      : html`<table class="table" data-testid="http-tools"><thead><tr><th>Tool</th><th>Method</th>
          <th>URL</th><th>Description</th><th>Parameters</th><th></th></tr></thead><tbody>
          ${data.map((t) => html`<tr key=${t.id} data-testid=${`http-row-${t.id}`}>
            <td data-testid=${`http-tool-${t.id}`}><code>${t.tool || `http__${t.name}`}</code></td>
            <td>${t.method}</td><td><code>${t.url}</code><div><${Masked} value=${t.headers} /></div></td>
            <td data-testid=${`http-description-${t.id}`}>${t.description}</td>
            <td><${Json} value=${t.parameters} /></td>
            <td class="actions"><${Button} testid=${`http-delete-${t.id}`} kind="danger" confirm="Delete this tool?"
              onClick=${() => remove(t.id)}>Delete<//></td></tr>`)}
        </tbody></table>`}
    <${HttpForm} onCreated=${() => { load(); onChange(); }} />
  </section>`;
}

// Rows of tool glob + allow/deny, saved as a whole (PUT replaces the rules).
function RulesEditor({ rules, testid, onSave }) {
  const [rows, setRows] = useState(rules.map((r) => ({ ...r })));
  const [saved, setSaved] = useState(false);
  const [error, setError] = useState(null);
  useEffect(() => { setRows(rules.map((r) => ({ ...r }))); }, [rules]);
  const edit = (i, k) => (e) => {
    setSaved(false);
    setRows(rows.map((r, j) => (j === i ? { ...r, [k]: e.target.value } : r)));
  };
  const save = async (ev) => {
    ev.preventDefault();
    setError(null);
    setSaved(false);
    try {
      await onSave(rows.map((r) => ({ tool: r.tool.trim(), action: r.action })));
      setSaved(true);
    } catch (e) {
      setError(e);
    }
  };
  return html`<form data-testid=${testid} onSubmit=${save}>
    ${rows.length === 0 && html`<${Empty} text="No rules: every tool is allowed (unless a global rule denies it)" />`}
    ${rows.map((r, i) => html`<div class="toolbar" key=${i} data-testid=${`${testid}-rule`}>
      <input data-testid=${`${testid}-tool`} required placeholder="mcp__github__*" value=${r.tool}
        onInput=${edit(i, "tool")} />
      <select data-testid=${`${testid}-action`} value=${r.action} onChange=${edit(i, "action")}>
        <option value="allow">allow</option><option value="deny">deny</option></select>
      <button type="button" class="btn btn-link" data-testid=${`${testid}-remove`}
        onClick=${() => { setSaved(false); setRows(rows.filter((_, j) => j !== i)); }}>remove</button>
    </div>`)}
    <div class="toolbar">
      <button type="button" class="btn" data-testid=${`${testid}-add`}
        onClick=${() => { setSaved(false); setRows([...rows, { tool: "", action: "deny" }]); }}>Add rule</button>
      <button type="submit" class="btn btn-primary" data-testid=${`${testid}-save`}>Save</button>
      ${saved && html`<span class="muted" data-testid=${`${testid}-saved`}>Saved</span>`}
    </div>
    ${error && html`<${ErrorBox} error=${error} />`}
  </form>`;
}

function Policy({ user }) {
  const { data, error, load } = useLoad("/tools/policy", (r) => r);
  const save = (scope) => async (rules) => {
    await api("PUT", "/tools/policy", { query: { scope }, body: { rules } });
    await load();
  };
  return html`<section data-testid="policy-section">
    <h2>Policy</h2>
    <p class="muted">In each list the first rule that matches a tool's name decides; a global deny
      always wins; a tool no rule matches is allowed. Globs: <code>*</code>, <code>?</code>, <code>[...]</code>.</p>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${data && html`<div class="card"><h3>Your rules</h3>
      <${RulesEditor} testid="policy-user" rules=${data.rules} onSave=${save(undefined)} /></div>
      <div class="card"><h3>Global rules</h3>
      ${user.admin ? html`<${RulesEditor} testid="policy-global" rules=${data.global_rules} onSave=${save("global")} />`
        : data.global_rules.length === 0 ? html`<${Empty} text="No global rules" />`
        : html`<table class="table" data-testid="policy-global"><thead><tr><th>Tool</th><th>Action</th></tr></thead>
          <tbody>${data.global_rules.map((r, i) => html`<tr key=${i} data-testid="policy-global-rule">
            <td><code>${r.tool}</code></td><td>${r.action}</td></tr>`)}</tbody></table>`}</div>`}
  </section>`;
}

function AllTools({ version }) {
  const { data, error, load } = useLoad("/tools", (r) => r.tools);
  useEffect(() => { if (version) load(); }, [version]);
  const groups = {};
  for (const t of data || []) (groups[t.source] = groups[t.source] || []).push(t);
  const order = [...SOURCES, ...Object.keys(groups).filter((s) => !SOURCES.includes(s))];
  return html`<section data-testid="all-tools">
    <h2>All tools</h2>
    <p class="muted">What your agents can be offered, by where each comes from.</p>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${data === null ? html`<p class="muted">Loading…</p>` : order.filter((s) => groups[s]).map((s) => html`
      <details key=${s} open data-testid=${`tools-group-${s}`}>
        <summary><strong>${s}</strong> <span class="muted">(${groups[s].length})</span></summary>
        <table class="table"><tbody>${groups[s].map((t) => html`<tr key=${t.name} data-testid="tool-row" data-tool=${t.name}>
          <td><code>${t.name}</code></td><td>${t.description}</td>
          <td class="muted">${t.origin == null ? "" : String(t.origin)}</td></tr>`)}</tbody></table>
      </details>`)}
  </section>`;
}

export default function Page({ user }) {
  const [version, setVersion] = useState(0);
  const changed = useCallback(() => setVersion((v) => v + 1), []);
  return html`<div class="tools-page" data-testid="tools-page">
    <h1>Tools</h1>
    <${McpServers} user=${user} onChange=${changed} />
    <${HttpTools} onChange=${changed} />
    <${Policy} user=${user} />
    <${AllTools} version=${version} />
  </div>`;
}
