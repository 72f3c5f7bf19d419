// The console's only way to the service: the API under /api/v1 with the user's bearer token.
// The token lives in sessionStorage (gone with the tab, never in a URL or a cookie, so no
// request can carry it without this code adding it).

const BASE = "/api/v1";
const KEY = "orch.token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  sessionStorage.setItem(KEY, t);
  me = null;
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
  me = null;
}

// An error answer of the API (DESIGN.md: {ok: false, error, code, request_id}).
export class ApiError extends Error {
  constructor(status, code, message, requestId) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.requestId = requestId;
  }
}

function url(path, query) {
  const u = new URL(BASE + path, window.location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, String(v));
  }
  return u.pathname + u.search;
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

async function failure(r) {
  let body = null;
  try {
    body = await r.json();
  } catch (_) {
    // not our error body (a proxy's page): the status says enough
  }
  const message = (body && (body.error || body.detail)) || `${r.status} ${r.statusText}`;
  return new ApiError(
    r.status,
    (body && body.code) || "http_error",
    String(message),
    (body && body.request_id) || r.headers.get("x-request-id"),
  );
}

// Listeners told when the API says the token is not (or no longer) valid.
const unauthorized = new Set();
export function onUnauthorized(fn) {
  unauthorized.add(fn);
  return () => unauthorized.delete(fn);
}

export async function api(method, path, { query, body } = {}) {
  const init = { method, headers: headers() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(url(path, query), init);
  } catch (e) {
    throw new ApiError(0, "network_error", `the service did not answer: ${e.message}`, null);
  }
  if (!r.ok) {
    const err = await failure(r);
    if (r.status === 401) unauthorized.forEach((fn) => fn(err));
    throw err;
  }
  if (r.status === 204) return null;
  return r.json();
}

let me = null;
export async function whoami() {
  if (!me) me = api("GET", "/whoami").then((r) => ({ user_uuid: r.user_uuid, admin: r.admin }));
  try {
    return await me;
  } catch (e) {
    me = null;
    throw e;
  }
}

// Parse SSE frames out of a text buffer; returns [frames, rest].
export function parseFrames(buffer) {
  const frames = [];
  const blocks = buffer.replace(/\r\n/g, "\n").split("\n\n");
  const rest = blocks.pop();
  for (const block of blocks) {
    const frame = { id: null, type: "message", data: "" };
    let hasData = false;
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") frame.id = value;
      else if (field === "event") frame.type = value;
      else if (field === "data") {
        frame.data += (hasData ? "\n" : "") + value;
        hasData = true;
      }
    }
    if (hasData) frames.push(frame);
  }
  return [frames, rest];
}

// SSE over fetch() (EventSource cannot send Authorization). Reconnects with backoff, resuming
// after the last event seen with Last-Event-ID; `onState` hears open/reconnecting/closed.
export function stream(path, query, { onEvent, onState, lastEventId } = {}) {
  let last = lastEventId ?? null;
  let closed = false;
  let controller = null;
  let delay = 500;
  const state = (s) => onState && onState(s);

  async function once() {
    controller = new AbortController();
    const h = headers({ Accept: "text/event-stream" });
    if (last !== null && last !== undefined) h["Last-Event-ID"] = String(last);
    const r = await fetch(url(path, query), { headers: h, signal: controller.signal });
    if (!r.ok) {
      const err = await failure(r);
      if (r.status === 401) unauthorized.forEach((fn) => fn(err));
      throw err;
    }
    state("open");
    delay = 500;
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      const [frames, rest] = parseFrames(buffer);
      buffer = rest;
      for (const f of frames) {
        if (f.id !== null && f.id !== "") last = f.id;
        let data = f.data;
        try {
          data = JSON.parse(f.data);
        } catch (_) {
          // not JSON: handed over as text
        }
        if (onEvent) onEvent({ id: f.id, type: f.type, data });
      }
    }
  }

  (async () => {
    while (!closed) {
      try {
        await once();
      } catch (e) {
        if (closed) break;
        // 4xx other than 429: retrying cannot help (bad filter, no access)
        if (e instanceof ApiError && e.status >= 400 && e.status < 500 && e.status !== 429) {
          closed = true;
          state("closed");
          if (onEvent) onEvent({ id: null, type: "error", data: { error: e.message, code: e.code } });
          return;
        }
      }
      if (closed) break;
      state("reconnecting");
      await new Promise((res) => setTimeout(res, delay));
      delay = Math.min(delay * 2, 10000);
    }
    state("closed");
  })();

  return {
    close() {
      closed = true;
      if (controller) controller.abort();
    },
    lastEventId: () => last,
  };
}
