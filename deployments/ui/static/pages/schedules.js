// Schedules (SPEC part 4): the job list with next run, last run, errors and status; create
// with a natural-language phrase or a cron expression (previewing its next runs); pause,
// unpause, run now; a job's detail with its scheduler events. The API is admin-only for all
// but a job's detail.
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, StatusBadge, Button, ErrorBox, Empty, Json, Field } from "../components.js";

const JOB_EVENTS = "scheduler.job_created,scheduler.task_dispatched,scheduler.job_executed";
const POLL_MS = 3000;
const PREVIEW_DELAY_MS = 400;

function scheduleText(job) {
  if (job.cron_expr) return `cron ${job.cron_expr}`;
  if (job.interval_ms) return `every ${job.interval_ms / 1000} s`;
  return job.schedule_type;
}

// The run's time on the wall clock of the job's zone, as its cron or phrase reads.
function wallClock(ms, tz) {
  try {
    return new Date(ms).toLocaleString("sv-SE", { timeZone: tz, dateStyle: "short", timeStyle: "short" }) + ` ${tz}`;
  } catch (_) {
    return tz;
  }
}

// The next runs of the schedule being typed, as the scheduler computes them (POST
// /schedules/preview): the console computes no schedule of its own.
function Preview({ form, when, tz }) {
  const [runs, setRuns] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    setRuns(null);
    setError(null);
    if (!when.trim()) return undefined;
    let live = true;
    const timer = setTimeout(async () => {
      const body = form === "cron" ? { cron: when } : { schedule: when };
      if (tz) body.tz = tz;
      try {
        const out = await api("POST", "/schedules/preview", { body });
        if (live) setRuns(out);
      } catch (e) {
        if (live) setError(e);
      }
    }, PREVIEW_DELAY_MS);
    return () => { live = false; clearTimeout(timer); };
  }, [form, when, tz]);
  if (error) return html`<${ErrorBox} error=${error} />`;
  if (!runs) return null;
  return html`<div class="preview" data-testid="schedule-preview">
    <strong>Next runs</strong> <span class="muted">(${runs.tz}${runs.cron_expr ? `, cron ${runs.cron_expr}` : ""})</span>
    <ol>${runs.next_runs.map((ms) => html`<li key=${ms} data-testid="schedule-preview-run">
      ${new Date(ms).toISOString()} <span class="muted">(${wallClock(ms, runs.tz)}, <${Time} ms=${ms} />)</span></li>`)}</ol>
  </div>`;
}

function CreateForm({ onCreated }) {
  const [form, setForm] = useState("natural");
  const [prompt, setPrompt] = useState("");
  const [name, setName] = useState("");
  const [when, setWhen] = useState("");
  const [tz, setTz] = useState("");
  const [created, setCreated] = useState(null);
  const [error, setError] = useState(null);

  const submit = async (ev) => {
    ev.preventDefault();
    setError(null);
    const body = { prompt };
    if (name) body.name = name;
    if (tz) body.tz = tz;
    if (form === "cron") body.cron = when;
    else body.schedule = when;
    try {
      const out = await api("POST", "/schedules", { body });
      setCreated(out);
      onCreated(out.id);
    } catch (e) {
      setError(e);
    }
  };

  return html`<form class="card" data-testid="schedule-create" onSubmit=${submit}>
    <h3>New schedule</h3>
    <div class="toolbar">
      <label><input type="radio" name="form" data-testid="schedule-form-natural"
        checked=${form === "natural"} onChange=${() => setForm("natural")} /> Phrase</label>
      <label><input type="radio" name="form" data-testid="schedule-form-cron"
        checked=${form === "cron"} onChange=${() => setForm("cron")} /> Cron</label>
    </div>
    <${Field} label="Prompt"><textarea data-testid="schedule-prompt" required value=${prompt}
      onInput=${(e) => setPrompt(e.target.value)}></textarea><//>
    <${Field} label="Name" hint="default: the prompt's first line"><input data-testid="schedule-name"
      value=${name} onInput=${(e) => setName(e.target.value)} /><//>
    <${Field} label=${form === "cron" ? "Cron (5 fields)" : "When"}
      hint=${form === "cron" ? "minute hour day month weekday" : "every 5 minutes, every day at 9:00, every monday at 10:30, tomorrow at 8am"}>
      <input data-testid="schedule-when" required value=${when}
        placeholder=${form === "cron" ? "*/5 * * * *" : "every 5 minutes"}
        onInput=${(e) => setWhen(e.target.value)} /><//>
    <${Field} label="Time zone" hint="IANA name; default UTC"><input data-testid="schedule-tz"
      value=${tz} placeholder="UTC" onInput=${(e) => setTz(e.target.value)} /><//>
    <${Preview} form=${form} when=${when} tz=${tz} />
    <button class="btn btn-primary" type="submit" data-testid="schedule-submit">Create</button>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${created && html`<p class="notice" data-testid="schedule-created">Job ${created.id} created; first run <${Time} ms=${created.next_run} /></p>`}
  </form>`;
}

function JobDetail({ id, version }) {
  const [job, setJob] = useState(null);
  const [events, setEvents] = useState([]);
  const [error, setError] = useState(null);

  useEffect(() => {
    let live = true;
    const load = async () => {
      try {
        const [detail, page] = await Promise.all([
          api("GET", `/schedules/${id}`),
          api("GET", "/events", { query: { aggregate: String(id), types: JOB_EVENTS, limit: 50 } }),
        ]);
        if (!live) return;
        setJob(detail);
        setEvents(page.data.slice().reverse());
        setError(null);
      } catch (e) {
        if (live) setError(e);
      }
    };
    load();
    const timer = setInterval(load, POLL_MS);
    return () => { live = false; clearInterval(timer); };
  }, [id, version]);

  if (error) return html`<${ErrorBox} error=${error} />`;
  if (!job) return html`<p class="muted">Loading job ${id}…</p>`;
  return html`<section class="card" data-testid="schedule-detail">
    <h3>Job ${job.id}: ${job.name}</h3>
    <dl class="facts">
      <dt>Schedule</dt><dd>${scheduleText(job)} (${job.tz})</dd>
      <dt>Prompt</dt><dd><pre data-testid="schedule-detail-prompt">${job.prompt}</pre></dd>
      <dt>Last result</dt><dd data-testid="schedule-detail-result">${job.last_result ?? "—"}</dd>
      <dt>Last error</dt><dd>${job.last_error ?? "—"}</dd>
      <dt>Paused because</dt><dd>${job.paused_reason ?? "—"}</dd>
      <dt>Running</dt><dd>${job.running ? "yes" : "no"}</dd>
    </dl>
    <h4>Events</h4>
    ${events.length === 0
      ? html`<${Empty} text="No events yet" />`
      : html`<table class="table" data-testid="schedule-events"><thead><tr>
          <th>#</th><th>Type</th><th>When</th><th>Data</th></tr></thead><tbody>
          ${events.map((e) => html`<tr key=${e.id} data-testid="schedule-event" data-type=${e.type}>
            <td>${e.position}</td><td>${e.type}</td><td><${Time} ms=${e.timestamp} /></td>
            <td><${Json} value=${e.data} /></td></tr>`)}
        </tbody></table>`}
  </section>`;
}

export default function Page({ user }) {
  const [jobs, setJobs] = useState(null);
  const [error, setError] = useState(null);
  const [selected, setSelected] = useState(null);
  const [version, setVersion] = useState(0);

  const refresh = useCallback(async () => {
    try {
      const page = await api("GET", "/schedules", { query: { per_page: 200 } });
      setJobs(page.items);
      setError(null);
    } catch (e) {
      setError(e);
    }
  }, []);

  useEffect(() => {
    refresh();
    const timer = setInterval(refresh, POLL_MS);
    return () => clearInterval(timer);
  }, [refresh]);

  const act = async (id, action) => {
    try {
      await api("POST", `/schedules/${id}/${action}`);
      setSelected(id);
      setVersion((v) => v + 1);
      await refresh();
    } catch (e) {
      setError(e);
    }
  };

  const remove = async (id) => {
    try {
      await api("DELETE", `/schedules/${id}`);
      if (selected === id) setSelected(null);
      await refresh();
    } catch (e) {
      setError(e);
    }
  };

  return html`<div class="schedules-page">
    <h2>Schedules</h2>
    ${!user.admin && html`<p class="muted">Only admins list and change schedules.</p>`}
    ${error && html`<${ErrorBox} error=${error} />`}
    ${jobs === null ? html`<p class="muted">Loading…</p>`
      : jobs.length === 0 ? html`<${Empty} text="No schedules" />`
      : html`<table class="table" data-testid="schedules-table"><thead><tr>
          <th>Id</th><th>Name</th><th>Schedule</th><th>Status</th><th>Next run</th>
          <th>Last run</th><th>Errors</th><th></th></tr></thead><tbody>
          ${jobs.map((j) => html`<tr key=${j.id} data-testid=${`schedule-row-${j.id}`}>
            <td>${j.id}</td>
            <td><a href="#/schedules" data-testid=${`schedule-open-${j.id}`}
              onClick=${(e) => { e.preventDefault(); setSelected(j.id); }}>${j.name}</a></td>
            <td>${scheduleText(j)}</td>
            <td data-testid=${`schedule-status-${j.id}`}>
              <${StatusBadge} status=${j.enabled ? "active" : "paused"} /></td>
            <td data-testid=${`schedule-next-${j.id}`}><${Time} ms=${j.next_run} /></td>
            <td><${Time} ms=${j.last_run} /></td>
            <td class=${j.consecutive_errors ? "bad" : ""}>${j.consecutive_errors}</td>
            <td class="actions">
              ${j.enabled
                ? html`<${Button} testid=${`schedule-pause-${j.id}`}
                    onClick=${() => act(j.id, "pause")}>Pause<//>`
                : html`<${Button} testid=${`schedule-unpause-${j.id}`}
                    onClick=${() => act(j.id, "unpause")}>Unpause<//>`}
              <${Button} testid=${`schedule-run-${j.id}`} disabled=${!j.enabled}
                onClick=${() => act(j.id, "run")}>Run now<//>
              <${Button} testid=${`schedule-delete-${j.id}`} kind="danger" confirm="Delete this schedule?"
                onClick=${() => remove(j.id)}>Delete<//>
            </td></tr>`)}
        </tbody></table>`}
    ${selected !== null && html`<${JobDetail} id=${selected} version=${version} />`}
    ${user.admin && html`<${CreateForm} onCreated=${(id) => { setSelected(id); refresh(); }} />`}
  </div>`;
}
