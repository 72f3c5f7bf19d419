// The shell: sign-in, navigation, a hash router loading one page module per route, sign-out
// and an error banner. Pages are `pages/<name>.js`, each `export default function Page({route,
// params, user})`.
import { html, render, useEffect, useRef, useState } from "./vendor/preact-htm.module.js";
import { ApiError, clearToken, onUnauthorized, setToken, token, whoami } from "./api.js";
import { ErrorBox } from "./components.js";

const ROUTES = [
  ["workflows", "Workflows"],
  ["interventions", "Approvals"],
  ["events", "Events"],
  ["schedules", "Schedules"],
  ["models", "Models"],
  ["channels", "Channels"],
  ["memory", "Memory"],
  ["tools", "Tools"],
  ["marketplace", "Marketplace"],
  ["ops", "Operations"],
];
const NAMES = new Set(ROUTES.map(([n]) => n));

// `#/workflows/wf-1?x=y` -> {name: "workflows", params: {id: "wf-1", rest: [...], query: {x: "y"}}}
export function parseHash(hash) {
  const raw = (hash || "").replace(/^#\/?/, "");
  const [path, qs] = raw.split("?", 2);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const name = NAMES.has(parts[0]) ? parts[0] : "workflows";
  const query = Object.fromEntries(new URLSearchParams(qs || ""));
  return { name, params: { id: parts[1], rest: parts.slice(1), query } };
}

function SignIn({ onSignedIn }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setToken(value.trim());
    try {
      onSignedIn(await whoami());
    } catch (err) {
      clearToken();
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="signin">
    <h1>Orchestrator console</h1>
    <form onSubmit=${submit} data-testid="signin-form">
      <label class="field"><span class="field-label">API token</span>
        <input type="password" autocomplete="off" value=${value} required
          onInput=${(e) => setValue(e.target.value)} data-testid="signin-token" /></label>
      <button class="btn btn-primary" type="submit" disabled=${busy} data-testid="signin-submit">Sign in</button>
    </form>
    <p class="muted">The token stays in this tab (sessionStorage) and is sent only to this service's API.</p>
    <${ErrorBox} error=${error} />
  </main>`;
}

function Shell({ user, onSignOut }) {
  const [route, setRoute] = useState(parseHash(window.location.hash));
  const routed = useRef(window.location.hash); // the hash `route` was parsed from
  const [Page, setPage] = useState(null);
  const [error, setError] = useState(null);

  useEffect(() => {
    const on = () => {
      routed.current = window.location.hash;
      setRoute(parseHash(routed.current));
    };
    window.addEventListener("hashchange", on);
    // Effects run after paint: a hash changed between the first render and this line
    // fired no event we heard, so read it once now.
    if (window.location.hash !== routed.current) on();
    return () => window.removeEventListener("hashchange", on);
  }, []);

  useEffect(() => {
    let live = true;
    setError(null);
    import(`./pages/${route.name}.js`)
      .then((m) => live && setPage(() => m.default))
      .catch((e) => live && setError(new ApiError(0, "page_unavailable", `page ${route.name}: ${e.message}`, null)));
    return () => {
      live = false;
    };
  }, [route.name]);

  return html`<div class="shell">
    <header class="topbar">
      <a class="brand" href="#/workflows">Orchestrator</a>
      <nav data-testid="nav">
        ${ROUTES.map(
          ([name, label]) => html`<a key=${name} href=${`#/${name}`} class=${route.name === name ? "active" : ""}
            data-testid=${`nav-${name}`}>${label}</a>`,
        )}
      </nav>
      <span class="who" data-testid="whoami">${user.user_uuid}${user.admin ? " (admin)" : ""}</span>
      <button class="btn btn-link" onClick=${onSignOut} data-testid="signout">Sign out</button>
    </header>
    <div class="banner">
      <${ErrorBox} error=${error} />
    </div>
    <main class="page" data-testid=${`page-${route.name}`}>
      ${Page && html`<${Page} key=${route.name} route=${route.name} params=${route.params} user=${user} />`}
    </main>
  </div>`;
}

function App() {
  const [user, setUser] = useState(null);
  const [checking, setChecking] = useState(Boolean(token()));
  const [expired, setExpired] = useState(null);

  useEffect(() => {
    if (!token()) return;
    whoami()
      .then(setUser)
      .catch(() => clearToken())
      .finally(() => setChecking(false));
  }, []);

  // A token that stops working (revoked, expired) signs the user out, saying why; a wrong
  // token typed at sign-in is the form's own error.
  const signedIn = useRef(false);
  signedIn.current = Boolean(user);
  useEffect(
    () =>
      onUnauthorized((err) => {
        if (!signedIn.current) return;
        clearToken();
        setUser(null);
        setExpired(err);
      }),
    [],
  );

  const signOut = () => {
    clearToken();
    setUser(null);
  };
  if (checking) return html`<p class="muted">Loading...</p>`;
  if (!user) {
    return html`<div>
      ${expired && html`<${ErrorBox} error=${expired} />`}
      <${SignIn} onSignedIn=${(u) => {
        setExpired(null);
        setUser(u);
      }} />
    </div>`;
  }
  return html`<${Shell} user=${user} onSignOut=${signOut} />`;
}

render(html`<${App} />`, document.getElementById("app"));
