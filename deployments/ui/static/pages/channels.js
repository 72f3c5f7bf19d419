// Channels (SPEC part 5): the caller's channels with type, status and delivery failures;
// create one (its webhook token is shown once, as the API returns it once), pause and
// resume, delete. Secrets come back from the API as `***` and stay that way here.
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, StatusBadge, Button, ErrorBox, Empty, Json, Field } from "../components.js";

const TYPES = ["webhook", "slack", "teams", "telegram"];

function CreateForm({ onCreated }) {
  const [type, setType] = useState("webhook");
  const [name, setName] = useState("");
  const [config, setConfig] = useState("{}");
  const [created, setCreated] = useState(null);
  const [error, setError] = useState(null);

  const submit = async (ev) => {
    ev.preventDefault();
    setError(null);
    let parsed;
    try {
      parsed = JSON.parse(config || "{}");
    } catch (e) {
      setError({ message: `config is not JSON: ${e.message}` });
      return;
    }
    try {
      const out = await api("POST", "/channels", { body: { type, name, config: parsed } });
      setCreated(out.data);
      onCreated();
    } catch (e) {
      setError(e);
    }
  };

  return html`<form class="card" data-testid="channel-create" onSubmit=${submit}>
    <h3>New channel</h3>
    <${Field} label="Type"><select data-testid="channel-type" value=${type}
      onChange=${(e) => setType(e.target.value)}>
      ${TYPES.map((t) => html`<option value=${t}>${t}</option>`)}</select><//>
    <${Field} label="Name"><input data-testid="channel-name" required value=${name}
      onInput=${(e) => setName(e.target.value)} /><//>
    <${Field} label="Config (JSON)"><textarea data-testid="channel-config" value=${config}
      onInput=${(e) => setConfig(e.target.value)}></textarea><//>
    <button class="btn btn-primary" type="submit" data-testid="channel-submit">Create</button>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${created && html`<p class="notice" data-testid="channel-created">
      Channel ${created.id} created. Webhook path (shown once):${" "}
      <code>${created.webhook_path}</code></p>`}
  </form>`;
}

export default function Page() {
  const [channels, setChannels] = useState(null);
  const [error, setError] = useState(null);

  const refresh = useCallback(async () => {
    try {
      setChannels((await api("GET", "/channels")).data);
    } catch (e) {
      setError(e);
    }
  }, []);
  useEffect(() => { refresh(); }, [refresh]);

  const run = (fn) => async (...args) => {
    setError(null);
    try {
      await fn(...args);
      await refresh();
    } catch (e) {
      setError(e);
    }
  };
  const setStatus = run((id, status) => api("PUT", `/channels/${id}`, { body: { status } }));
  const remove = run((id) => api("DELETE", `/channels/${id}`));

  return html`<div class="channels-page">
    <h2>Channels</h2>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${channels === null ? html`<p class="muted">Loading…</p>`
      : channels.length === 0 ? html`<${Empty} text="No channels" />`
      : html`<table class="table" data-testid="channels-table"><thead><tr>
          <th>Id</th><th>Type</th><th>Name</th><th>Status</th><th>Failures</th>
          <th>Last error</th><th>Config</th><th>Created</th><th></th></tr></thead><tbody>
          ${channels.map((c) => html`<tr key=${c.id} data-testid=${`channel-row-${c.id}`}>
            <td>${c.id}</td><td>${c.type}</td><td data-testid=${`channel-name-${c.id}`}>${c.name}</td>
            <td data-testid=${`channel-status-${c.id}`}><${StatusBadge} status=${c.status} /></td>
            <td>${c.failures}</td><td>${c.last_error ?? ""}</td>
            <td><${Json} value=${c.config} /></td><td><${Time} ms=${c.created_at} /></td>
            <td class="actions">
              ${c.status === "paused"
                ? html`<${Button} testid=${`channel-resume-${c.id}`}
                    onClick=${() => setStatus(c.id, "active")}>Resume<//>`
                : html`<${Button} testid=${`channel-pause-${c.id}`}
                    onClick=${() => setStatus(c.id, "paused")}>Pause<//>`}
              <${Button} testid=${`channel-delete-${c.id}`} kind="danger" confirm="Delete this channel?"
                onClick=${() => remove(c.id)}>Delete<//>
            </td></tr>`)}
        </tbody></table>`}
    <${CreateForm} onCreated=${refresh} />
  </div>`;
}
