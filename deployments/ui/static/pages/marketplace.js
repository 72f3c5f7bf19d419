// Marketplace (SPEC part 6): browse (by tags) and search skills, read one (which counts a
// download, as the API does), publish as yourself, report a skill, delete your own; admins
// also see pending reports and dismiss them. Descriptions and bodies are untrusted: text.
import { html, useState, useEffect, useCallback } from "../vendor/preact-htm.module.js";
import { api } from "../api.js";
import { Time, Button, ErrorBox, Empty, Field } from "../components.js";

const PAGE = 50;

function Detail({ skill, user, onReport, onDelete }) {
  const [reason, setReason] = useState("");
  const mine = skill.author === user.user_uuid;
  return html`<section class="card" data-testid="skill-detail">
    <h3>${skill.name} <span class="muted">v${skill.version} by ${skill.author}</span></h3>
    <p data-testid="skill-detail-description">${skill.description}</p>
    <p class="muted">Tags: ${skill.tags.join(", ") || "—"}; ${skill.downloads} downloads;${" "}
      published <${Time} ms=${skill.created_at} />, updated <${Time} ms=${skill.updated_at} /></p>
    <pre data-testid="skill-detail-body">${skill.body}</pre>
    ${(mine || user.admin) && html`<${Button} testid="skill-delete" kind="danger" confirm="Delete this skill?"
      onClick=${() => onDelete(skill)}>Delete<//>`}
    <form class="toolbar" onSubmit=${(e) => { e.preventDefault(); onReport(skill, reason); }}>
      <input data-testid="skill-report-reason" placeholder="Why report it?" required
        value=${reason} onInput=${(e) => setReason(e.target.value)} />
      <button class="btn btn-primary" type="submit" data-testid="skill-report">Report</button>
    </form>
  </section>`;
}

function Publish({ onPublished }) {
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [tags, setTags] = useState("");
  const [body, setBody] = useState("");
  const [error, setError] = useState(null);
  const submit = async (ev) => {
    ev.preventDefault();
    setError(null);
    try {
      const tagList = tags.split(",").map((t) => t.trim()).filter(Boolean);
      const out = await api("POST", "/marketplace/publish",
        { body: { name, description, tags: tagList, body } });
      onPublished(out);
    } catch (e) {
      setError(e);
    }
  };
  return html`<form class="card" data-testid="skill-publish" onSubmit=${submit}>
    <h3>Publish a skill</h3>
    <${Field} label="Name"><input data-testid="skill-publish-name" required value=${name}
      onInput=${(e) => setName(e.target.value)} /><//>
    <${Field} label="Description"><input data-testid="skill-publish-description" value=${description}
      onInput=${(e) => setDescription(e.target.value)} /><//>
    <${Field} label="Tags (comma-separated)"><input data-testid="skill-publish-tags" value=${tags}
      onInput=${(e) => setTags(e.target.value)} /><//>
    <${Field} label="Body"><textarea data-testid="skill-publish-body" required value=${body}
      onInput=${(e) => setBody(e.target.value)}></textarea><//>
    <button class="btn btn-primary" type="submit" data-testid="skill-publish-submit">Publish</button>
    ${error && html`<${ErrorBox} error=${error} />`}
  </form>`;
}

function Reports({ reports, onDismiss }) {
  return html`<section class="card" data-testid="skill-reports"><h3>Pending reports</h3>
    ${reports.length === 0 ? html`<${Empty} text="No pending reports" />`
      : html`<table class="table"><thead><tr><th>Skill</th><th>Author</th><th>Reporter</th>
        <th>Reason</th><th>When</th><th></th></tr></thead><tbody>
        ${reports.map((r) => html`<tr key=${r.id} data-testid="skill-report-row">
          <td>${r.name}</td><td>${r.author}</td><td>${r.reporter}</td><td>${r.reason}</td>
          <td><${Time} ms=${r.created_at} /></td>
          <td><${Button} testid=${`skill-dismiss-${r.id}`}
            onClick=${() => onDismiss(r)}>Dismiss<//></td></tr>`)}
      </tbody></table>`}</section>`;
}

export default function Page({ user }) {
  const [list, setList] = useState(null);
  const [offset, setOffset] = useState(0);
  const [q, setQ] = useState("");
  const [searching, setSearching] = useState("");
  const [tags, setTags] = useState("");
  const [skill, setSkill] = useState(null);
  const [reports, setReports] = useState(null);
  const [notice, setNotice] = useState(null);
  const [error, setError] = useState(null);

  const refresh = useCallback(async () => {
    try {
      const query = { limit: PAGE, offset };
      const page = searching
        ? await api("GET", "/marketplace/search", { query: { ...query, q: searching } })
        : await api("GET", "/marketplace/browse", { query: tags ? { ...query, tags } : query });
      setList(page);
      if (user.admin) setReports((await api("GET", "/marketplace/reports")).reports);
    } catch (e) {
      setError(e);
    }
  }, [offset, searching, tags, user.admin]);
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
  const open = guard(async (item) => {
    setSkill(await api("GET", `/marketplace/detail/${encodeURIComponent(item.name)}`,
      { query: { author: item.author } }));
    await refresh(); // the detail counted a download: the list shows the new count
  });
  const report = guard(async (s, reason) => {
    await api("POST", `/marketplace/report/${encodeURIComponent(s.name)}`,
      { body: { reason, author: s.author } });
    setNotice(`Reported ${s.name}`);
    await refresh();
  });
  const remove = guard(async (s) => {
    await api("DELETE", `/marketplace/delete/${encodeURIComponent(s.name)}`,
      { query: { author: s.author } });
    setSkill(null);
    setNotice(`Deleted ${s.name}`);
    await refresh();
  });
  const dismiss = guard(async (r) => {
    await api("POST", `/marketplace/dismiss/${encodeURIComponent(r.name)}`,
      { query: { author: r.author } });
    await refresh();
  });

  return html`<div class="marketplace-page">
    <h2>Marketplace</h2>
    <form class="toolbar" onSubmit=${(e) => { e.preventDefault(); setOffset(0); setSearching(q); }}>
      <input data-testid="skill-query" placeholder="Search skills" value=${q}
        onInput=${(e) => setQ(e.target.value)} />
      <button class="btn btn-primary" type="submit" data-testid="skill-search">Search</button>
      <input data-testid="skill-tags" placeholder="Tags (browse)" value=${tags}
        onChange=${(e) => { setOffset(0); setSearching(""); setTags(e.target.value); }} />
    </form>
    ${error && html`<${ErrorBox} error=${error} />`}
    ${notice && html`<p class="notice" data-testid="skill-notice">${notice}</p>`}
    ${list === null ? html`<p class="muted">Loading…</p>`
      : list.items.length === 0 ? html`<${Empty} text="No skills" />`
      : html`<table class="table" data-testid="skills-table"><thead><tr><th>Name</th>
          <th>Author</th><th>Description</th><th>Tags</th><th>Downloads</th><th>Version</th>
          </tr></thead><tbody>
          ${list.items.map((s) => html`<tr key=${`${s.name}/${s.author}`}
            data-testid=${`skill-row-${s.name}`}>
            <td><a href="#/marketplace" data-testid=${`skill-open-${s.name}`}
              onClick=${(e) => { e.preventDefault(); open(s); }}>${s.name}</a></td>
            <td>${s.author}</td><td>${s.description}</td><td>${s.tags.join(", ")}</td>
            <td data-testid=${`skill-downloads-${s.name}`}>${s.downloads}</td><td>${s.version}</td></tr>`)}
        </tbody></table>
        <div class="toolbar"><span class="muted">${list.total} skills</span>
          <button class="btn" disabled=${offset === 0} onClick=${() => setOffset(Math.max(0, offset - PAGE))}>
            Previous</button>
          <button class="btn" disabled=${!list.has_more} onClick=${() => setOffset(offset + PAGE)}>Next</button>
        </div>`}
    ${skill && html`<${Detail} skill=${skill} user=${user} onReport=${report} onDelete=${remove} />`}
    ${reports && html`<${Reports} reports=${reports} onDismiss=${dismiss} />`}
    <${Publish} onPublished=${(out) => { setNotice(`Published ${out.name} v${out.version}`); refresh(); }} />
  </div>`;
}
