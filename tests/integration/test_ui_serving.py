"""The web console's static files at /ui on the in-process app (real Postgres and Redis):
the index at /ui and /ui/, the security headers on every /ui answer (errors included), no
token needed for them while the API still needs one, and no way out of the static folder."""

from __future__ import annotations

import asyncio
import http.client

import httpx
from prometheus_client.parser import text_string_to_metric_families

from deployments.ui import CSP
from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _assert_secured(r: httpx.Response) -> None:
    assert r.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


def _raw_get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    """GET with the request target sent byte for byte (httpx would resolve `..` first)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", target, skip_accept_encoding=True)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


async def test_console_files_headers_and_auth(make_settings) -> None:
    async with ServedApp(make_settings()) as app, httpx.AsyncClient(base_url=app.url) as c:
        for path in ("/ui", "/ui/"):
            r = await c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"].startswith("text/html")
            assert r.headers["cache-control"] == "no-cache"
            assert '<div id="app">' in r.text and 'src="/ui/app.js"' in r.text
            assert "<script>" not in r.text and "style=" not in r.text  # nothing inline
            _assert_secured(r)

        for path, kind in (
            ("/ui/app.js", "text/javascript"),
            ("/ui/api.js", "text/javascript"),
            ("/ui/style.css", "text/css"),
            ("/ui/vendor/preact-htm.module.js", "text/javascript"),
            ("/ui/pages/workflows.js", "text/javascript"),
        ):
            r = await c.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
            _assert_secured(r)

        head = await c.head("/ui/app.js")
        assert head.status_code == 200 and int(head.headers["content-length"]) > 0

        # Unknown files, files of other kinds, other methods: our error body, still secured.
        for path in ("/ui/nope.js", "/ui/vendor/SHA256SUMS", "/ui/__init__.py", "/ui/static"):
            r = await c.get(path)
            assert r.status_code == 404, path
            body = r.json()
            assert body["ok"] is False and body["code"] == "not_found" and body["request_id"]
            _assert_secured(r)
        r = await c.post("/ui/app.js", json={})
        assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
        _assert_secured(r)

        # No token for the console's files; the API it calls still wants one.
        assert (await c.get("/api/v1/whoami")).status_code == 401
        assert (await c.get("/api/v1/workflows")).status_code == 401
        r = await c.get("/api/v1/whoami", headers=ADMIN)
        assert r.json()["admin"] is True
        # Look-alikes are not exempt.
        assert (await c.get("/uix")).status_code == 401
        assert (await c.get("/api/v1/ui/whoami")).status_code in (401, 404)
        assert (await c.get("/api/v1/ui")).status_code in (401, 404)

        # Metrics label the console's files by one route, not one label a file.
        text = (await c.get("/api/v1/metrics")).text
        paths = {
            s.labels["path"]
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "svc_http_requests_total"
        }
        assert {"/ui", "/ui/", "/ui/{file:path}"} <= paths
        assert not any("app.js" in p or "nope" in p for p in paths), paths

        # Path traversal, sent raw: dot segments, encoded dots, encoded slashes, backslashes.
        for target in (
            "/ui/../deployments/ui/__init__.py",
            "/ui/../../pyproject.toml",
            "/ui/%2e%2e/__init__.py",
            "/ui/%2e%2e/static/app.js",  # refused even where it would lead back inside
            "/ui/%2E%2E/%2e%2e/pyproject.toml",
            "/ui/vendor/%2e%2e/%2e%2e/__init__.py",
            "/ui/..%2f__init__.py",
            "/ui/..%5c__init__.py",
            "/ui/./app.js/",
            "/ui//etc/passwd",
        ):
            status, headers, raw = await asyncio.to_thread(_raw_get, app.port, target)
            assert status == 404, (target, status, raw[:200])
            assert b"import" not in raw and b"[project]" not in raw, target
            if target.startswith("/ui/"):
                assert headers["content-security-policy"] == CSP, target
