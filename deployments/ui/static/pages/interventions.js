// Approvals (issue 32): the interventions the caller may see (the workflows they own or are
// listed to decide for; admins all), pending first, with approve (an optional note) and reject
// (a reason is required). Live from /sync-events. `Decide` is also drawn on a workflow's page.
import { html, useCallback, useEffect, useRef, useState } from "../vendor/preact-htm.module.js";
import { api, stream } from "../api.js";
import { Button, ErrorBox, Field, Json, StatusBadge, Table, Time } from "../components.js";

const STATES = ["pending", "approved", "rejected", "expired", ""];
export const INTERVENTION_TYPES = ["audit.intervention_pending", "audit.intervention_approved", "audit.intervention_rejected"];

// Who decided, as the API records it: a user from the API or a person on a platform.
export function decidedBy(iv) {
  const d = iv.decided_by;
  if (!d) return iv.via === "timeout" ? "nobody (expired)" : iv.via || "";
  return d.user_uuid ? d.user_uuid : `${d.platform_user} on ${d.platform}`;
}

// Approve or reject one pending intervention; `onDone()` after the decision (or a 409: someone
// else decided first, which the reload shows).
export function Decide({ iv, onDone }) {
  const [note, setNote] = useState("");
  const [reason, setReason] = useState("");
  const [error, setError] = useState(null);
  const id = encodeURIComponent(iv.id);
  const act = async (verb, body) => {
    try {
      await api("POST", `/interventions/${id}/${verb}`, { body });
      setError(null);
    } catch (e) {
      setError(e);
    }
    onDone && onDone();
  };
  return html`<div class="decide" data-testid="iv-decide" data-iv=${iv.id}>
    <${Field} label="Note">
      <input value=${note} maxlength="2000" onInput=${(e) => setNote(e.target.value)} data-testid="iv-note" />
    <//>
    <${Button} kind="primary" onClick=${() => act("approve", note.trim() ? { note: note.trim() } : {})}
      testid="iv-approve">Approve<//>
    <${Field} label="Reason">
      <input value=${reason} maxlength="2000" onInput=${(e) => setReason(e.target.value)} data-testid="iv-reason" />
    <//>
    <${Button} kind="danger" disabled=${!reason.trim()} onClick=${() => act("reject", { reason: reason.trim() })}
      testid="iv-reject">Reject<//>
    <${ErrorBox} error=${error} />
  </div>`;
}

// What is asked: the question, and for a tool call the tool with its (masked) arguments.
export function Asked({ iv }) {
  return html`<div class="asked">
    <div data-testid="iv-question">${iv.question}</div>
    ${iv.tool && html`<div>tool <code data-testid="iv-tool">${iv.tool}</code></div>`}
    ${iv.arguments && html`<${Json} value=${iv.arguments} testid="iv-arguments" />`}
  </div>`;
}

export default function Page({ params }) {
  const [status, setStatus] = useState(params.query.status ?? "pending");
  const [page, setPage] = useState(null);
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const timer = useRef(null);
  const limit = 50;

  const load = useCallback(async () => {
    try {
      const query = { limit, offset };
      if (status) query.status = status;
      setPage(await api("GET", "/interventions", { query }));
      setError(null);
    } catch (e) {
      setError(e);
    }
  }, [status, offset]);

  useEffect(() => {
    load();
    const reload = () => {
      clearTimeout(timer.current);
      timer.current = setTimeout(load, 250);
    };
    const s = stream("/sync-events", { types: INTERVENTION_TYPES.join(",") }, {
      onEvent: (ev) => ev.type !== "error" && reload(),
      onState: (st) => st === "open" && reload(),
    });
    return () => {
      clearTimeout(timer.current);
      s.close();
    };
  }, [load]);

  const columns = [
    { key: "id", label: "Id", render: (iv) => html`<span data-testid="iv-id">${iv.id}</span>` },
    { key: "status", label: "Status", render: (iv) => html`<${StatusBadge} status=${iv.status} testid="iv-status" />` },
    {
      key: "workflow_id", label: "Workflow",
      render: (iv) => html`<a href=${`#/workflows/${encodeURIComponent(iv.workflow_id)}`} data-testid="iv-workflow">${iv.workflow_id}</a>
        <span class="muted"> step ${iv.step}</span>`,
    },
    { key: "question", label: "Asks", render: (iv) => html`<${Asked} iv=${iv} />` },
    { key: "created_at", label: "Asked", render: (iv) => html`<${Time} ms=${iv.created_at} />` },
    {
      key: "decision", label: "Decision",
      render: (iv) => iv.status === "pending"
        ? html`<span class="muted">expires <${Time} ms=${iv.expires_at} /></span><${Decide} iv=${iv} onDone=${load} />`
        : html`<span data-testid="iv-decided-by">${decidedBy(iv)}</span> <${Time} ms=${iv.decided_at} />
          ${iv.note && html`<div class="muted">${iv.note}</div>`}${iv.reason && html`<div class="muted">${iv.reason}</div>`}`,
    },
  ];
  return html`<section>
    <div class="toolbar">
      <h1>Approvals</h1>
      <${Field} label="Status">
        <select value=${status} data-testid="iv-filter-status" onChange=${(e) => {
          setOffset(0);
          setStatus(e.target.value);
        }}>
          ${STATES.map((s) => html`<option key=${s} value=${s}>${s || "any"}</option>`)}
        </select>
      <//>
    </div>
    <${ErrorBox} error=${error} />
    ${page && html`<${Table} testid="iv-table" columns=${columns} rows=${page.data} rowKey=${(iv) => iv.id}
      empty=${status === "pending" ? "Nothing waits for a decision." : "No interventions."} />
      <p class="muted">${page.total} in all
        ${offset > 0 && html` <button class="btn btn-link" onClick=${() => setOffset(Math.max(0, offset - limit))}>newer</button>`}
        ${offset + limit < page.total && html` <button class="btn btn-link" onClick=${() => setOffset(offset + limit)}>older</button>`}
      </p>`}
  </section>`;
}
