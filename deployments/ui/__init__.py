"""The web console's static files at `/ui` (docs/console.md).

Served from the package (importlib.resources) by the same ingress as the API: no CDN, no
network at run time. The console is plain static files: every piece of data it shows comes
from the API with the user's bearer token, so `/ui` itself needs none (the authentication
layer exempts it, as it does /health) and the console adds no data route.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import FastAPI, Request
from fastapi.responses import Response

from deployments.errors import error_response, request_id_of
from orchestrator.errors import MethodNotAllowed, NotFound

UI_PREFIX = "/ui"

# No inline script or style, nothing from another origin: injected markup could run nothing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Only these kinds of file are served: anything else in the package stays private.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
}
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _static() -> Traversable:
    return resources.files("deployments.ui") / "static"


def _find(rest: str) -> Traversable | None:
    """The static file `rest` names ("" is the index), or None. Every segment must be a
    plain name: no empty, dot or dot-dot segment (the path arrives percent-decoded, so
    `%2e%2e` is `..` here), no backslash."""
    if rest in ("", "/"):
        rest = "/index.html"
    if not rest.startswith("/"):
        return None  # `/uix`: not ours
    parts = rest[1:].split("/")
    if any(not p or p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        return None
    suffix = "." + parts[-1].rpartition(".")[2]
    if suffix not in CONTENT_TYPES:
        return None
    node = _static()
    for part in parts:
        node = node / part
    return node if node.is_file() else None


def _with_headers(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


async def _serve(request: Request, prefix: str = UI_PREFIX) -> Response:
    rest = request.path_params.get("rest", "")
    if request.method not in ("GET", "HEAD"):
        refused = MethodNotAllowed(f"{request.method} not allowed on the console's files")
        response = error_response(refused, request_id_of(request))
        response.headers["Allow"] = "GET, HEAD"
        return _with_headers(response)
    found = _find(rest)
    if found is None:
        err = NotFound(f"no console file {request.url.path!r}")
        return _with_headers(error_response(err, request_id_of(request)))
    name = found.name
    headers = {"Content-Type": CONTENT_TYPES["." + name.rpartition(".")[2]]}
    if name == "index.html":
        headers["Cache-Control"] = "no-cache"  # always the current shell (it names the rest)
        data = found.read_bytes()
        # The index names its files absolutely (`/ui` has no trailing slash to resolve
        # against, and CSP's base-uri 'none' rules out <base>): rewritten under another prefix.
        if prefix != UI_PREFIX:
            data = data.replace(b'"/ui/', f'"{prefix}/'.encode())
    else:
        data = found.read_bytes()
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(data))
        data = b""
    return _with_headers(Response(data, headers=headers))


def mount(app: FastAPI, prefix: str = UI_PREFIX) -> None:
    """Serve the console at `prefix` (`prefix` and `prefix/` are its index)."""

    async def serve(request: Request) -> Response:
        return await _serve(request, prefix)

    app.add_api_route(prefix + "{rest:path}", serve, methods=_METHODS, include_in_schema=False)
