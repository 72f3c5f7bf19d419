// Events: a live tail of /sync-events with filters (aggregate, type prefix, user for admins),
// pause and resume (resuming after the last event shown, so nothing is skipped), and a link
// from each event to what it is about.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.module.js";
import { api, stream } from "../api.js";
import { Button, Empty, ErrorBox, Field, Time } from "../components.js";

const KEEP = 500; // events kept on screen
const BACKLOG = 50; // events shown from before the tail started

// Where an event leads: its workflow, scheduled job or model instance.
export function linkOf(e) {
  const d = e.data || {};
  const agg = String(e.aggregate_id || "");
  const wf = d.workflow_id || (/^wf-\d+/.exec(agg) || [])[0];
  if (wf) return [`#/workflows/${encodeURIComponent(wf)}`, wf];
  if (d.job_id || e.type.startsWith("scheduler.")) return ["#/schedules", d.job_id || agg];
  if (d.instance_id || e.type.startsWith("model.")) return ["#/models", d.instance_id || d.model_name || agg];
  return null;
}

// On the stream an event carries its stream name (`workflow:step:started`); the table shows
// every row by its store name (`workflow.step_started`), as the backlog from GET /events has it.
export function storeName(type) {
  const t = String(type || "");
  if (!t.startsWith("workflow:")) return t;
  const rest = t.slice("workflow:".length);
  return rest.startsWith("step:") ? `workflow.step_${rest.slice("step:".length)}` : `workflow.${rest}`;
}

function matches(e, prefix) {
  if (!prefix) return true;
  const t = String(e.type || "");
  // Stream names are colon-style for workflow types (`workflow:step:started`): match both.
  return t.startsWith(prefix) || t.replace(/[.:_]/g, ".").startsWith(prefix.replace(/[.:_]/g, "."));
}

function Row({ e }) {
  const link = linkOf(e);
  const data = JSON.stringify(e.data);
  return html`<tr data-testid="ev-row" data-type=${e.type}>
    <td class="muted">${e.position}</td>
    <td><${Time} ms=${e.timestamp} /></td>
    <td data-testid="ev-type">${e.type}</td>
    <td>${link ? html`<a href=${link[0]} data-testid="ev-link">${link[1]}</a>` : e.aggregate_id}</td>
    <td>${e.user_uuid || html`<span class="muted">system</span>`}</td>
    <td><code data-testid="ev-data">${data.length > 300 ? `${data.slice(0, 300)}...` : data}</code></td>
  </tr>`;
}

export default function Page({ params, user }) {
  const q = params.query || {};
  const [aggregate, setAggregate] = useState(q.aggregate || "all");
  const [prefix, setPrefix] = useState(q.type || "");
  const [who, setWho] = useState(q.user || "");
  const [applied, setApplied] = useState({ aggregate: q.aggregate || "all", prefix: q.type || "", who: q.user || "" });
  const [events, setEvents] = useState([]);
  const [paused, setPaused] = useState(false);
  const [live, setLive] = useState("closed");
  const [error, setError] = useState(null);
  const last = useRef(null);
  const backlogFor = useRef(null);

  // While not paused: the backlog (the last BACKLOG events, once per filter), then the tail
  // from the last event shown, so a resume or a reconnect skips nothing.
  useEffect(() => {
    if (paused) return undefined;
    let cancelled = false;
    let tail = null;
    const query = { aggregate: applied.aggregate || "all", user_uuid: applied.who || undefined };
    (async () => {
      if (backlogFor.current !== applied) {
        backlogFor.current = applied;
        last.current = null;
        setEvents([]);
        try {
          const head = await api("GET", "/events", { query: { ...query, limit: 1 } });
          const offset = Math.max(0, head.total - BACKLOG);
          const r = await api("GET", "/events", { query: { ...query, limit: BACKLOG, offset } });
          if (cancelled) return;
          if (r.data.length) last.current = r.data[r.data.length - 1].position;
          setEvents(r.data.filter((e) => matches(e, applied.prefix)).reverse());
          setError(null);
        } catch (e) {
          if (!cancelled) setError(e);
        }
      }
      if (cancelled) return;
      tail = stream("/sync-events", query, {
        lastEventId: last.current,
        onEvent: (ev) => {
          if (ev.type === "error") {
            setError({ message: ev.data.error, code: ev.data.code });
            return;
          }
          if (!ev.data || typeof ev.data !== "object") return;
          const e = { ...ev.data, type: storeName(ev.data.type) };
          last.current = e.position ?? ev.id;
          if (!matches(e, applied.prefix)) return;
          setEvents((old) => [e, ...old].slice(0, KEEP));
        },
        onState: setLive,
      });
    })();
    return () => {
      cancelled = true;
      if (tail) tail.close();
      setLive("closed");
    };
  }, [paused, applied]);

  const apply = (ev) => {
    ev.preventDefault();
    setApplied({ aggregate: aggregate.trim() || "all", prefix: prefix.trim(), who: who.trim() });
  };

  return html`<section>
    <form class="toolbar" onSubmit=${apply} data-testid="ev-filters">
      <h1>Events</h1>
      <${Field} label="Aggregate"><input value=${aggregate} onInput=${(e) => setAggregate(e.target.value)} data-testid="ev-aggregate" /><//>
      <${Field} label="Type prefix"><input value=${prefix} placeholder="workflow." onInput=${(e) => setPrefix(e.target.value)} data-testid="ev-type-prefix" /><//>
      ${user && user.admin && html`<${Field} label="User"><input value=${who} placeholder="any" onInput=${(e) => setWho(e.target.value)} data-testid="ev-user" /><//>`}
      <button class="btn btn-primary" type="submit" data-testid="ev-apply">Apply</button>
      <${Button} onClick=${() => setPaused(!paused)} testid="ev-pause">${paused ? "Resume" : "Pause"}<//>
      <span class=${`live live-${paused ? "closed" : live}`} data-testid="live-state">${paused ? "paused" : live === "open" ? "live" : live}</span>
    </form>
    <${ErrorBox} error=${error} />
    ${events.length === 0
      ? html`<${Empty} text="No events yet for this filter." />`
      : html`<table class="table events-list" data-testid="ev-table">
          <thead><tr><th>#</th><th>When</th><th>Type</th><th>About</th><th>User</th><th>Data</th></tr></thead>
          <tbody>${events.map((e) => html`<${Row} key=${e.position} e=${e} />`)}</tbody>
        </table>`}
  </section>`;
}
