// Workflows: the list (status filter, live status) and one workflow's page (steps as a
// timeline with each attempt and the model and tool calls it made, a step's pending approval
// with its buttons, the overrides (retry or skip a step, resume, re-run from a step), children
// as a tree, cancel and delete, a coordinate step's agent team (members and mail log, issue
// 33), live from /sync-events).
import { html, useCallback, useEffect, useRef, useState } from "../vendor/preact-htm.module.js";
import { api, stream } from "../api.js";
import { Button, Empty, ErrorBox, Field, Json, StatusBadge, Table, Time, duration } from "../components.js";
import { Asked, Decide, INTERVENTION_TYPES } from "./interventions.js";

const STATES = ["", "pending", "running", "completed", "failed", "cancelled"];
const WORKFLOW_TYPES = [
  "workflow.started", "workflow.completed", "workflow.failed", "workflow.cancelled",
  "workflow.step_started", "workflow.step_completed", "workflow.step_failed", "workflow.compensating",
  "workflow.step_retrying", "audit.workflow_override",
];
// What an attempt's agent did (aggregate `<workflow>:<step>:<attempt>`).
const CALL_TYPES = ["agent.turn_started", "agent.turn_completed", "audit.tool_executed", "audit.tool_denied", "task.failed"];
// The model's choice each turn: aggregated by request id, so read by type and matched on task_id.
const DECISION = "audit.llm_decision";

// A coordinate step's agent team (issue 33), aggregated by its team id.
const TEAM_TYPES = ["team.created", "team.member_joined", "team.member_left", "team.mail_sent", "team.destroyed"];

// Coalesce bursts of live events into one reload.
function useDebounced(fn, ms) {
  const timer = useRef(null);
  useEffect(() => () => clearTimeout(timer.current), []);
  return useCallback(() => {
    clearTimeout(timer.current);
    timer.current = setTimeout(fn, ms);
  }, [fn, ms]);
}

function LiveState({ state }) {
  return html`<span class=${`live live-${state}`} data-testid="live-state">${state === "open" ? "live" : state}</span>`;
}

function List({ params }) {
  const [status, setStatus] = useState(params.query.status || "");
  const [page, setPage] = useState(null);
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const [live, setLive] = useState("closed");
  const limit = 50;

  const load = useCallback(async () => {
    try {
      setPage(await api("GET", "/workflows", { query: { status, limit, offset } }));
      setError(null);
    } catch (e) {
      setError(e);
    }
  }, [status, offset]);
  const reload = useDebounced(load, 250);

  useEffect(() => {
    load();
    const s = stream("/sync-events", { types: WORKFLOW_TYPES.slice(0, 4).join(",") }, {
      onEvent: (ev) => ev.type !== "error" && reload(),
      onState: (st) => {
        setLive(st);
        if (st === "open") reload(); // whatever changed while (re)connecting
      },
    });
    return () => s.close();
  }, [load]);

  const columns = [
    { key: "id", label: "Id", render: (w) => html`<a href=${`#/workflows/${encodeURIComponent(w.id)}`} data-testid="wf-link">${w.id}</a>` },
    { key: "name", label: "Name", render: (w) => html`<span data-testid="wf-name">${w.name}</span>` },
    { key: "status", label: "Status", render: (w) => html`<${StatusBadge} status=${w.status} testid="wf-row-status" />` },
    { key: "parent_id", label: "Parent", render: (w) => w.parent_id && html`<a href=${`#/workflows/${encodeURIComponent(w.parent_id)}`}>${w.parent_id}</a>` },
    { key: "created_at", label: "Created", render: (w) => html`<${Time} ms=${w.created_at} />` },
    { key: "updated_at", label: "Updated", render: (w) => html`<${Time} ms=${w.updated_at} />` },
  ];
  return html`<section>
    <div class="toolbar">
      <h1>Workflows</h1>
      <${Field} label="Status">
        <select value=${status} data-testid="wf-filter-status" onChange=${(e) => {
          setOffset(0);
          setStatus(e.target.value);
        }}>
          ${STATES.map((s) => html`<option key=${s} value=${s}>${s || "any"}</option>`)}
        </select>
      <//>
      <${LiveState} state=${live} />
    </div>
    <${ErrorBox} error=${error} />
    ${page && html`<${Table} testid="wf-table" columns=${columns} rows=${page.data} rowKey=${(w) => w.id}
      empty="No workflows." />
      <p class="muted">${page.total} in all
        ${offset > 0 && html` <button class="btn btn-link" onClick=${() => setOffset(Math.max(0, offset - limit))}>newer</button>`}
        ${offset + limit < page.total && html` <button class="btn btn-link" onClick=${() => setOffset(offset + limit)}>older</button>`}
      </p>`}
  </section>`;
}

// ` (mcp mcp-3)`: where a called tool comes from, and its server's or tool's id.
function via(d) {
  const id = d.mcp_server_id || d.http_tool_id;
  return d.source ? ` (${d.source}${id ? ` ${id}` : ""})` : "";
}

// The calls an attempt's agent made, from its events.
function Calls({ events }) {
  if (!events || events.length === 0) return null;
  return html`<ul class="calls" data-testid="step-calls">
    ${events.map((e) => {
      const d = e.data || {};
      let text;
      if (e.type === "agent.turn_started") text = `turn ${d.turn}: model ${d.model}`;
      else if (e.type === "agent.turn_completed") text = `turn ${d.turn} done: ${d.tokens_in} in / ${d.tokens_out} out tokens, ${d.tool_calls} tool call(s)`;
      else if (e.type === "audit.tool_executed") text = `tool ${d.tool}${via(d)} ${d.ok ? "ok" : "failed"} (${duration(d.duration_ms)})`;
      else if (e.type === "audit.tool_denied") text = `tool ${d.tool}${via(d)} refused: ${d.reason}`;
      else if (e.type === DECISION) text = d.decision === "final" ? "model answered (final)" : `model chose ${(d.tools || []).join(", ")}`;
      else text = `${e.type}: ${d.error || ""}`;
      return html`<li key=${e.position} data-testid="step-call">${text}</li>`;
    })}
  </ul>`;
}

// One attempt: when it started, how long it ran, why it failed or that it was lost.
function Attempt({ a }) {
  const took = a.ended_at && a.started_at ? ` - ${duration(a.ended_at - a.started_at)}` : a.duration_ms !== undefined ? ` - ${duration(a.duration_ms)}` : "";
  return html`<span class="muted" data-testid="step-attempt" data-attempt=${a.attempt}>attempt ${a.attempt}${took}
    ${a.started ? html` - <${Time} ms=${a.started} />` : ""}
    ${a.lost ? html` - <span data-testid="step-attempt-lost">lost with its worker (not sent again)</span>` : ""}
    ${a.error ? html` - <span data-testid="step-attempt-error">${a.error}</span>` : ""}</span>`;
}

// The attempts the API lists (each run's start, end, error, lost) joined with the calls seen
// in each attempt's events.
function joinAttempts(step, seen) {
  const listed = step.attempts || [];
  if (listed.length === 0) return seen;
  return listed.map((a) => {
    const s = seen.find((x) => x.attempt === a.attempt) || {};
    return { ...s, ...a, started: a.started_at ?? s.started, calls: s.calls || [] };
  });
}

// A step's agent team: its members (role, state, tools, task) and its mail log (the text is
// shown to the team's owner only: the API leaves it out for anyone else).
function Team({ team }) {
  if (!team) return null;
  return html`<div class="team" data-testid="step-team" data-team=${team.id}>
    <strong>Team ${team.id}</strong> <span class="muted">${team.state}, at most ${team.max_members} running</span>
    <${Table} testid="team-members" rows=${team.members} rowKey=${(m) => m.name} empty="No members yet." columns=${[
      { key: "name", label: "Member" },
      { key: "role", label: "Role" },
      { key: "state", label: "State", render: (m) => html`<${StatusBadge} status=${m.state} />` },
      { key: "tools", label: "Tools", render: (m) => (m.tools ? m.tools.join(", ") : "the step's") },
      { key: "task_id", label: "Task", render: (m) => html`<a href=${`#/events?aggregate=${encodeURIComponent(m.task_id)}`}>${m.task_id}</a>` },
      { key: "joined_at", label: "Joined", render: (m) => html`<${Time} ms=${m.joined_at} />` },
      { key: "left_at", label: "Left", render: (m) => (m.left_at ? html`<${Time} ms=${m.left_at} />` : "") },
    ]} />
    <${Table} testid="team-mail" rows=${team.mail} rowKey=${(m) => m.id} empty="No mail yet." columns=${[
      { key: "sender", label: "From", render: (m) => m.from },
      { key: "to", label: "To" },
      { key: "size", label: "Bytes" },
      { key: "sent_at", label: "Sent", render: (m) => html`<${Time} ms=${m.sent_at} />` },
      { key: "read_at", label: "Read", render: (m) => (m.read_at ? html`<${Time} ms=${m.read_at} />` : "unread") },
      { key: "text", label: "Text" },
    ]} />
  </div>`;
}

function Step({ step, attempts, pending, actions, onChanged, team }) {
  const all = joinAttempts(step, attempts);
  return html`<li class=${`st-${step.status}`} data-testid="wf-step" data-step=${step.name}>
    <div class="step-head">
      <span class="step-name">${step.name}</span>
      <${StatusBadge} status=${step.status} testid="step-status" />
      ${all.map((a) => html`<${Attempt} key=${a.attempt} a=${a} />`)}
      ${step.next_attempt_at && html`<span class="muted" data-testid="step-next-attempt">next attempt <${Time} ms=${step.next_attempt_at} /></span>`}
      ${actions}
    </div>
    ${all.map((a) => html`<${Calls} key=${a.attempt} events=${a.calls} />`)}
    ${pending.map((iv) => html`<div key=${iv.id} class="waiting" data-testid="step-intervention" data-iv=${iv.id}>
      <strong>Waits for a decision</strong> <span class="muted">(<a href="#/interventions">${iv.id}</a>, expires <${Time} ms=${iv.expires_at} />)</span>
      <${Asked} iv=${iv} />
      <${Decide} iv=${iv} onDone=${onChanged} />
    </div>`)}
    <${Team} team=${team} />
    ${step.result !== undefined && html`<${Json} value=${step.result} testid="step-output" />`}
    ${step.error && html`<div class="error-box" data-testid="step-error">${step.error}</div>`}
  </li>`;
}

// Children as a tree (each child's own children, a few levels down).
async function loadTree(ids, depth, budget) {
  const out = [];
  for (const id of ids) {
    if (budget.left-- <= 0) break;
    try {
      const d = await api("GET", `/workflows/${encodeURIComponent(id)}`);
      const kids = depth < 3 ? await loadTree(d.children || [], depth + 1, budget) : [];
      out.push({ id, name: d.name, status: d.status, children: kids });
    } catch (e) {
      out.push({ id, name: "", status: e.code || "unknown", children: [] });
    }
  }
  return out;
}

function Tree({ nodes }) {
  if (!nodes || nodes.length === 0) return null;
  return html`<ul class="tree">
    ${nodes.map(
      (n) => html`<li key=${n.id} data-testid="wf-child">
        <a href=${`#/workflows/${encodeURIComponent(n.id)}`}>${n.id}</a> ${n.name} <${StatusBadge} status=${n.status} />
        <${Tree} nodes=${n.children} />
      </li>`,
    )}
  </ul>`;
}

// Per step name: its attempts, each with start time, duration and the agent's calls.
function attemptsOf(events, callsByTask, id) {
  const by = {};
  for (const e of events) {
    const d = e.data || {};
    if (!d.step || !e.type.startsWith("workflow.step_")) continue;
    const list = (by[d.step] = by[d.step] || []);
    let a = list.find((x) => x.attempt === (d.attempt ?? 1));
    if (!a) {
      a = { attempt: d.attempt ?? 1, calls: callsByTask[`${id}:${d.step}:${d.attempt ?? 1}`] || [] };
      list.push(a);
    }
    if (e.type === "workflow.step_started") a.started = e.timestamp;
    if (e.type === "workflow.step_completed") a.duration_ms = d.duration_ms;
  }
  return by;
}

function Detail({ params }) {
  const id = params.id;
  const [detail, setDetail] = useState(null);
  const [events, setEvents] = useState([]);
  const [calls, setCalls] = useState({});
  const [tree, setTree] = useState([]);
  const [error, setError] = useState(null);
  const [live, setLive] = useState("closed");
  const [gone, setGone] = useState(false);
  const [pending, setPending] = useState([]);
  const [fromStep, setFromStep] = useState("");
  const [teams, setTeams] = useState({});
  const children = useRef(new Set());
  const teamIds = useRef(new Set());

  const load = useCallback(async () => {
    try {
      const d = await api("GET", `/workflows/${encodeURIComponent(id)}`);
      const evs = (await api("GET", "/events", { query: { aggregate: id, limit: 1000 } })).data;
      const byTask = {};
      const tasks = new Set();
      for (const e of evs) {
        if (e.type === "workflow.step_started") tasks.add(`${id}:${e.data.step}:${e.data.attempt ?? 1}`);
      }
      await Promise.all(
        [...tasks].map(async (t) => {
          const r = await api("GET", "/events", { query: { aggregate: t, types: CALL_TYPES.join(","), limit: 200 } });
          byTask[t] = r.data;
        }),
      );
      if (tasks.size > 0) {
        // Decisions since the workflow's first event (from_position: the global cursor).
        const r = await api("GET", "/events", { query: { types: DECISION, from_position: evs[0].position, limit: 1000 } });
        for (const e of r.data) if (byTask[e.data.task_id]) byTask[e.data.task_id].push(e);
        for (const t of tasks) byTask[t].sort((a, b) => a.position - b.position);
      }
      const ivs = await api("GET", "/interventions", { query: { workflow_id: id, status: "pending", limit: 100 } });
      const ids = d.steps.map((s) => s.team_id).filter(Boolean);
      teamIds.current = new Set(ids);
      const found = {};
      await Promise.all(ids.map(async (t) => { found[t] = await api("GET", `/teams/${encodeURIComponent(t)}`); }));
      setTeams(found);
      children.current = new Set(d.children || []);
      setTree(await loadTree(d.children || [], 1, { left: 50 }));
      setDetail(d);
      setEvents(evs);
      setCalls(byTask);
      setPending(ivs.data);
      setError(null);
    } catch (e) {
      if (e.status === 404) setGone(true);
      setError(e);
    }
  }, [id]);
  const reload = useDebounced(load, 200);

  useEffect(() => {
    load();
    // One stream for the workflow's own events, its steps' agent calls and its children's:
    // picked out here. On a reconnect it resumes after the last event seen (Last-Event-ID).
    const s = stream("/sync-events", { types: [...WORKFLOW_TYPES, ...CALL_TYPES, DECISION, ...INTERVENTION_TYPES, ...TEAM_TYPES].join(",") }, {
      onEvent: (ev) => {
        const e = ev.data || {};
        const d = e.data || {};
        const agg = String(e.aggregate_id || "");
        const ours = d.workflow_id === id || agg.startsWith(`${id}:`) || teamIds.current.has(d.team_id);
        if (ours || children.current.has(d.workflow_id) || d.parent_id === id) {
          reload();
        }
      },
      onState: (st) => {
        setLive(st);
        if (st === "open") reload();
      },
    });
    return () => s.close();
  }, [id]);

  const cancel = async () => {
    try {
      await api("POST", `/workflows/${encodeURIComponent(id)}/cancel`);
      await load();
    } catch (e) {
      setError(e);
    }
  };
  // Overrides (owner or admin): each answers the workflow's new state, or a 409 naming the
  // state it does not apply to (shown in the error box).
  const act = async (path, body) => {
    try {
      const out = await api("POST", `/workflows/${encodeURIComponent(id)}${path}`, { body });
      setError(null);
      return out;
    } catch (e) {
      setError(e);
      return null;
    } finally {
      await load();
    }
  };
  const rerun = async () => {
    const from = fromStep || (detail && detail.steps[0] && detail.steps[0].name);
    const out = await act("/rerun", { from_step: from });
    const next = out && (out.id || out.workflow_id);
    if (next) window.location.hash = `#/workflows/${encodeURIComponent(next)}`;
  };
  const remove = async () => {
    try {
      await api("DELETE", `/workflows/${encodeURIComponent(id)}`);
      window.location.hash = "#/workflows";
    } catch (e) {
      setError(e);
    }
  };

  if (gone) return html`<section><h1>${id}</h1><${ErrorBox} error=${error} /><a href="#/workflows">All workflows</a></section>`;
  if (!detail) return html`<section><h1>${id}</h1><${ErrorBox} error=${error} /><p class="muted">Loading...</p></section>`;
  const attempts = attemptsOf(events, calls, id);
  const done = events.find((e) => e.type === "workflow.completed");
  const active = detail.status === "pending" || detail.status === "running";
  const waiting = (name) => pending.filter((iv) => iv.step === name);
  const stepActions = (s) => {
    const step = `/steps/${encodeURIComponent(s.name)}`;
    // The step a failed workflow stopped at, or a running workflow's running step.
    const applies = (detail.status === "failed" && s.status === "failed") || (detail.status === "running" && s.status === "running");
    if (!applies) return null;
    // A running approval step is a person's to decide (or to skip), not to retry.
    const approval = (s.intervention && s.intervention.kind === "approval") || waiting(s.name).some((iv) => iv.kind === "approval");
    return html`<span class="step-actions">
      ${!approval && html`<${Button} confirm="Retry this step?" onClick=${() => act(`${step}/retry`)} testid="step-retry">Retry<//>`}
      <${Button} confirm="Skip this step?" onClick=${() => act(`${step}/skip`)} testid="step-skip">Skip<//>
    </span>`;
  };
  return html`<section data-testid="wf-detail">
    <div class="toolbar">
      <h1 data-testid="wf-title">${detail.name}</h1>
      <${StatusBadge} status=${detail.status} testid="wf-status" />
      <${LiveState} state=${live} />
      ${active && html`<${Button} kind="danger" confirm="Cancel this workflow?" onClick=${cancel} testid="wf-cancel">Cancel<//>`}
      ${detail.status === "failed" && html`<${Button} kind="primary" confirm="Resume this workflow?" onClick=${() => act("/resume")} testid="wf-resume">Resume<//>`}
      ${!active && html`<span class="rerun">
        <select value=${fromStep || (detail.steps[0] && detail.steps[0].name)} onChange=${(e) => setFromStep(e.target.value)}
          data-testid="wf-rerun-step" aria-label="Re-run from step">
          ${detail.steps.map((s) => html`<option key=${s.name} value=${s.name}>from ${s.name}</option>`)}
        </select>
        <${Button} confirm="Re-run as a new workflow?" onClick=${rerun} testid="wf-rerun">Re-run<//>
      </span>`}
      ${!active && html`<${Button} kind="danger" confirm="Delete this workflow?" onClick=${remove} testid="wf-delete">Delete<//>`}
    </div>
    <div class="meta">
      <span data-testid="wf-id">${detail.id}</span>
      <span>created <${Time} ms=${detail.created_at} /></span>
      <span>updated <${Time} ms=${detail.updated_at} /></span>
      ${detail.rerun_of && html`<span>re-run of <a href=${`#/workflows/${encodeURIComponent(detail.rerun_of)}`} data-testid="wf-rerun-of">${detail.rerun_of}</a></span>`}
      ${detail.parent_id && html`<span>parent <a href=${`#/workflows/${encodeURIComponent(detail.parent_id)}`}>${detail.parent_id}</a></span>`}
      <a href=${`#/events?aggregate=${encodeURIComponent(detail.id)}`}>events</a>
    </div>
    <${ErrorBox} error=${error} />
    ${detail.error && html`<div class="error-box" data-testid="wf-error">${detail.error}</div>`}
    <h2>Steps</h2>
    ${detail.steps.length === 0 ? html`<${Empty} text="No steps." />` : html`<ol class="timeline" data-testid="wf-steps">
      ${detail.steps.map((s) => html`<${Step} key=${s.name} step=${s} attempts=${attempts[s.name] || []}
        pending=${waiting(s.name)} actions=${stepActions(s)} onChanged=${load} team=${teams[s.team_id]} />`)}
    </ol>`}
    ${done && html`<h2>Output</h2><${Json} value=${done.data.output ?? ""} testid="wf-output" />`}
    ${tree.length > 0 && html`<h2>Children</h2><div data-testid="wf-children"><${Tree} nodes=${tree} /></div>`}
  </section>`;
}

export default function Page({ params }) {
  return params.id ? html`<${Detail} key=${params.id} params=${params} />` : html`<${List} params=${params} />`;
}
