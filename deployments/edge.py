"""Our first code on a request's path under Serve: an ASGI layer around Serve's own HTTP
servers (its proxy, and each replica's direct-ingress port behind HAProxy).

Serve puts it there through its documented hook `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`
(a function that returns Starlette middlewares; Serve wraps its server's app in them, around
its own RequestIdMiddleware, in the proxy and in each replica's direct-ingress server), which
`orchestrator serve` sets to `first_hop` or `behind_our_haproxy` below
(deployments/launcher.py). No file of Ray's is patched.

Why in front of Serve and not only in the app: Serve reads some headers before the app runs,
decoding them as UTF-8 (X-Request-ID, the session and multiplexed-model ids, its timeout
headers: Ray 2.60 `replica.py` `_direct_ingress_asgi`, `proxy.py`
`setup_request_context_and_handle`). A byte that was not UTF-8 raised there, uvicorn answered
`500 text/plain` with its error logger silenced by Serve, and the app, which logs and counts
every request, never saw it. And Serve takes a client's X-Request-ID as the request's id,
echoes it and logs it.

Here, in each process that serves HTTP:
- a header whose name is not ASCII or whose value is not UTF-8 is removed, and the request
  goes on without it (Serve reads its headers as UTF-8; nothing we serve needs such bytes);
- request ids follow `request_ids`: ours is made by the first hop of ours and never taken
  from a client; a client's own, when well-formed, travels apart as X-Client-Request-ID;
- an exception out of Serve's code before any answer is logged with its traceback (secrets
  masked: this process may be Serve's proxy, where nothing else of ours masks them),
  answered with our error body and request id, and counted like the app's own 500s through
  the Api deployment; one after the answer began is the app's (it counted its status), and
  only passes on;
- a response carries one X-Request-ID: the first, when the app set its own (a request that
  skipped our HAProxy gets a fresh id from the app, deployments/layers/context.py) before Serve's
  RequestIdMiddleware appended the one it was handed.

Kept light (the standard library, Starlette, and `ray.serve` only when a 500 is counted): it
is imported in Serve's proxy, which has none of the app loaded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The one form a request id takes, ours or a client's: nothing in it can break a log line,
# a header or a page.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
REQUEST_ID_HEADER = b"x-request-id"
CLIENT_REQUEST_ID_HEADER = b"x-client-request-id"

# deployments.app's APP_NAME and INGRESS: not imported, that module loads the whole app.
APP_NAME = "orchestrator"
INGRESS = "Api"
REPORT_TIMEOUT_S = 10.0

# A child of Serve's logger: its records go where Serve's own go in this process (the
# proxy's proxy_*.log, a replica's replica_*.log), formatted as the service's lines are.
log = logging.getLogger("ray.serve.edge")


class _Redacted(logging.Filter):
    """Masks secrets in the edge's own records (message and traceback) before any handler
    formats them: in Serve's proxy no formatter of ours does (deployments/logs.py installs
    the redacting one in replicas only), and a traceback may quote a header or a path."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Imported on the first record (an error, so rare): the proxy stays light otherwise.
        from orchestrator.observability._logs import redact, traceback_text

        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and record.exc_info[0] is not None:
            # Formatters (ours, Serve's text and JSON ones) use exc_text when it is set.
            record.exc_text = redact(record.exc_text or traceback_text(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


log.addFilter(_Redacted())

# (method, path, seconds spent) of a 500 the edge answered.
Report = Callable[[str, str, float], None]


def new_request_id() -> str:
    return uuid.uuid4().hex


def well_formed(value: bytes | None) -> str | None:
    """`value` as a request id, or None when it is not one."""
    if value is None:
        return None
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if REQUEST_ID.fullmatch(text) else None


def request_ids(headers: Iterable[tuple[bytes, bytes]], *, trusted: bool) -> tuple[str, str | None]:
    """(the request's id, the client's own id or None): the one rule, wherever a request
    enters. `trusted`: a hop of ours set X-Request-ID (our HAProxy, this edge in Serve's
    proxy); a well-formed one is kept, anything else replaced. Otherwise this is the first
    hop and X-Request-ID is the client's: never our id (a client could tie its requests to
    another's, or repeat one), kept apart only when well-formed. Of repeated headers, the
    last counts."""
    ours = client = None
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            ours = value
        elif name == CLIENT_REQUEST_ID_HEADER:
            client = value
    if trusted:
        return well_formed(ours) or new_request_id(), well_formed(client)
    return new_request_id(), well_formed(ours)


def _utf8(value: bytes) -> bool:
    if value.isascii():  # nearly every header: no decoding needed to know
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def edge_headers(
    headers: Iterable[tuple[bytes, bytes]], *, trusted: bool
) -> tuple[list[tuple[bytes, bytes]], str]:
    """The headers Serve and the app get, and the request id: no header Serve would fail to
    decode, and the request ids of `request_ids` (X-Request-ID always set)."""
    kept = [(name, value) for name, value in headers if name.isascii() and _utf8(value)]
    request_id, client_id = request_ids(kept, trusted=trusted)
    out = [(n, v) for n, v in kept if n not in (REQUEST_ID_HEADER, CLIENT_REQUEST_ID_HEADER)]
    out.append((REQUEST_ID_HEADER, request_id.encode("ascii")))
    if client_id is not None:
        out.append((CLIENT_REQUEST_ID_HEADER, client_id.encode("ascii")))
    return out, request_id


_WEBHOOK = re.compile(r"^(/api/v1/channels/webhook/(?:decide/)?)[^/]+")


def loggable_path(path: str) -> str:
    """`path` without a channel's webhook token or a signed decision link's token (the
    credentials in those paths)."""
    return _WEBHOOK.sub(r"\1[redacted]", path)


class EdgeGuard:
    """The ASGI layer itself (see the module's docstring)."""

    def __init__(self, app: ASGIApp, trusted_request_id: bool, report: Report | None = None):
        self.app = app
        self._trusted = trusted_request_id
        self._report = report if report is not None else ApiCounter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers, request_id = edge_headers(scope.get("headers", ()), trusted=self._trusted)
        scope = {**scope, "headers": headers}
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered = False

        async def watched(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                message = {**message, "headers": _one_request_id(message.get("headers", ()))}
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if answered:
                # The app answered (its layers counted and logged the status it sent)
                # or Serve's code failed mid-answer: counting it here would count the
                # request twice. The server ends the connection.
                raise
            method, path = scope["method"], scope["path"]
            log.error(
                "unhandled error at the edge (request_id=%s) %s %s",
                request_id,
                method,
                loggable_path(path),
                exc_info=exc,
            )
            self._report(method, path, time.perf_counter() - started)
            await _internal_error(send, request_id)


def _one_request_id(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with only the first X-Request-ID (the app's own, when it set one)."""
    out: list[tuple[bytes, bytes]] = []
    seen = False
    for name, value in headers:
        if name.lower() == REQUEST_ID_HEADER:
            if seen:
                continue
            seen = True
        out.append((name, value))
    return out


async def _internal_error(send: Send, request_id: str) -> None:
    """What the app answers a 500 with (deployments/errors.py), internals left out."""
    body = json.dumps(
        {
            "ok": False,
            "error": "internal server error",
            "code": "internal_error",
            "request_id": request_id,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (REQUEST_ID_HEADER, request_id.encode("ascii")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiCounter:
    """Counts an edge 500 where the app counts its own: a call to the Api deployment's
    `record_edge_error` (any replica records it; its metrics reach the cluster's
    svc_http_requests_total and the SLO), since Serve's proxy has no metrics of ours. Sent
    in the background: the answer does not wait for it."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, method: str, path: str, duration_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self._send(method, path, duration_s))
        self._pending.add(task)  # held until done, so it is not collected
        task.add_done_callback(self._pending.discard)

    async def _send(self, method: str, path: str, duration_s: float) -> None:
        try:
            if self._handle is None:
                from ray import serve

                # A controller call the first time: off the event loop.
                self._handle = await asyncio.to_thread(
                    serve.get_deployment_handle, INGRESS, APP_NAME
                )
            response = self._handle.record_edge_error.remote(method, path, duration_s)
            await asyncio.wait_for(_awaited(response), REPORT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the 500 is logged already; say why uncounted
            log.warning("an edge 500 could not be counted: %r", exc)


async def _awaited(response: Any) -> Any:
    return await response


def first_hop() -> list[Middleware]:
    """For Serve's proxy when it is the first hop (`haproxy: false`): a client's
    X-Request-ID is never the request's id."""
    return [Middleware(EdgeGuard, trusted_request_id=False)]


def behind_our_haproxy() -> list[Middleware]:
    """For the replicas' direct-ingress servers and Serve's fallback proxy behind our HAProxy,
    which already made the request id (orchestrator/runtime/haproxy_harden.py): a well-formed
    one is kept. (A request that skipped HAProxy gets 421 from the app, under a fresh id the
    app makes and this edge lets win: it has no ingress key.)"""
    return [Middleware(EdgeGuard, trusted_request_id=True)]
