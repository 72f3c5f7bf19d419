"""Request id, authentication, rate limiting and request metrics, as one pure ASGI layer.

Pure ASGI (not BaseHTTPMiddleware) because it sits on every request's path.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.client_address import scope_client_address
from deployments.edge import request_ids
from deployments.errors import domain_error_response, internal_error_response
from deployments.input_guard import check_json, check_target, is_json
from orchestrator._json import loads
from orchestrator.auth import Principal
from orchestrator.errors import (
    MisdirectedRequest,
    OrchestratorError,
    PayloadTooLarge,
    Unauthorized,
)
from orchestrator.events import NewEvent
from orchestrator.observability import RouteTemplates, log_access

log = logging.getLogger(__name__)

# A route served by the middleware itself: (context, caller, request id, JSON body) -> the
# response to send (an ASGI app). See `RequestContextMiddleware._direct`.
DirectRoute = Callable[[Any, Principal, str, dict[str, Any]], Awaitable[ASGIApp]]

CLIENT_CLOSED = 499


WEBHOOK_PREFIX = "/api/v1/channels/webhook/"


def _public(path: str, exempt: list[str]) -> bool:
    """Served without a bearer token: the exempt paths, a channel's webhook (it carries its
    own credential: the token in the path, then the platform's signature, checked by its
    handler) and the web console's static files (its data calls are the API's, with the
    token)."""
    return (
        path in exempt
        or path.startswith(WEBHOOK_PREFIX)
        or path == "/ui"
        or path.startswith("/ui/")
    )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        ctx_getter: Any,
        templates: RouteTemplates,
        echo_request_id: bool,
        ingress_key: str | None = None,
        direct_routes: Mapping[tuple[str, str], DirectRoute] | None = None,
    ) -> None:
        self.app = app
        self._ingress_key = ingress_key
        self._ctx = ctx_getter
        self._templates = templates
        # Serve's proxy already answers with X-Request-ID (the id it put in the request headers).
        self._echo = echo_request_id
        self._direct_routes = dict(direct_routes or {})

    def _direct(
        self, scope: Scope, state: dict[str, Any], body: bytes | None
    ) -> tuple[DirectRoute, dict[str, Any]] | None:
        """The route to serve without FastAPI's routing and dependency resolution (the
        gateway's, on every model call's path), with its JSON object body; None: FastAPI
        serves the request (also a body that is not a JSON object, for its own errors)."""
        if body is None or "principal" not in state:
            return None
        route = self._direct_routes.get((scope["method"], scope["path"]))
        if route is None:
            return None
        try:
            data = loads(body)
        except (ValueError, RecursionError):
            return None
        return (route, data) if isinstance(data, dict) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Under Serve, X-Request-ID was made by a hop of ours (deployments/edge.py, our
        # HAProxy) and is echoed by Serve: kept when well-formed, so the header, the error
        # body and the logs agree. Served alone, this is the first hop: a client's id is
        # never ours, only kept apart (`client_request_id`) when well-formed. A request that
        # skipped our HAProxy (no ingress key) came straight from a client: its X-Request-ID
        # is the client's, never ours, though the edge in front had to trust it.
        misdirected = self._ingress_key is not None and not hmac.compare_digest(
            _header(scope, b"x-orch-ingress") or "", self._ingress_key
        )
        request_id, client_request_id = request_ids(
            scope.get("headers", ()), trusted=not self._echo and not misdirected
        )
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["client_request_id"] = client_request_id
        # Stays None when the client went away before any answer (recorded as 499, as nginx
        # does), so a cancelled request is not counted as a server error.
        status: int | None = None
        rid_header = (b"x-request-id", request_id.encode("ascii"))
        # Serve echoes the id it was handed (the client's, when misdirected): ours goes
        # first and the edge drops Serve's (deployments/edge.py `_one_request_id`).
        echo = self._echo or misdirected

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if echo:
                    message["headers"] = [rid_header, *message.get("headers", [])]
            await send(message)

        ctx = self._ctx()
        try:
            if misdirected:
                raise MisdirectedRequest("this request did not come through this service's proxy")
            path = scope["path"]
            if not _public(path, ctx.settings.exempt_paths):
                credentials = _credentials(scope)
                # Only a presented credential costs a lookup: those failures are throttled.
                address = (
                    scope_client_address(scope, ctx.settings.trusted_proxies)
                    if credentials
                    else None
                )
                try:
                    # The throttle is asked before a lookup, not for a token just verified.
                    principal = await ctx.authenticator.authenticate(
                        credentials, lambda: ctx.auth_throttle.check(address)
                    )
                except Unauthorized:
                    await ctx.auth_throttle.failed(address)
                    raise
                state["principal"] = principal
                if ctx.rate_limiter.enabled:
                    await ctx.rate_limiter.hit(principal.subject or principal.user_uuid)
            limit = ctx.settings.max_request_bytes
            declared = _header(scope, b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise PayloadTooLarge(
                    f"request body of {declared} bytes; at most {limit} (max_request_bytes)",
                    extra={"size": int(declared), "limit": limit},
                )
            check_target(scope)
            body_receive = _capped(receive, limit)
            body: bytes | None = None
            if scope["method"] in ("POST", "PUT", "PATCH") and is_json(scope):
                body = await _read_body(body_receive)
                check_json(body)
                body_receive = _replay(body, receive)
            direct = self._direct(scope, state, body)
            if direct is not None:
                serve_direct, data = direct
                response = await serve_direct(ctx, state["principal"], request_id, data)
                await response(scope, body_receive, send_with_id)
            else:
                await self.app(scope, body_receive, send_with_id)
        except OrchestratorError as exc:
            if status is not None:
                raise  # the answer has begun: nothing else can be sent
            if exc.status_code == 403:
                state["denied"] = exc.message
            await domain_error_response(exc, request_id)(scope, receive, send_with_id)
        except Exception as exc:
            if status is not None:
                raise
            # The last line of defence: log, answer 500 (or 503 for a dependency that is down).
            target = f"{scope['method']} {scope['path']}"
            await internal_error_response(exc, request_id, target)(scope, receive, send_with_id)
        finally:
            route = self._templates.match(scope["path"])
            final = CLIENT_CLOSED if status is None else status
            if final == 403 and state.get("principal") is not None:
                await _record_denial(ctx, state, scope["method"], route, request_id)
            elapsed = time.perf_counter() - started
            ctx.recorder.http_request(scope["method"], route, final, elapsed)
            if ctx.settings.access_log:
                principal = state.get("principal")
                log_access(
                    request_id=request_id,
                    client_request_id=client_request_id,
                    user=principal.user_uuid if principal is not None else None,
                    method=scope["method"],
                    route=route,
                    status=final,
                    duration_ms=elapsed * 1000,
                )


def _capped(receive: Receive, limit: int) -> Receive:
    """`receive` that stops a body (chunked, or longer than it declared) past `limit`."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(
                    f"request body over {limit} bytes (max_request_bytes)",
                    extra={"limit": limit},
                )
        return message

    return capped


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: the route sees an empty body
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read once already, then the connection's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _credentials(scope: Scope) -> str | None:
    """The bearer credentials: `Authorization`, else `x-api-key` (what the official
    Anthropic SDK sends its key in), taken as a bearer token."""
    authorization = _header(scope, b"authorization")
    if authorization:
        return authorization
    api_key = _header(scope, b"x-api-key")
    return f"Bearer {api_key}" if api_key else None


async def _record_denial(
    ctx: Any, state: dict[str, Any], method: str, route: str, request_id: str
) -> None:
    """audit.permission_deny for a 403 answered to an authenticated caller: who, which
    route, why. After the answer went out (a 403 waits for nothing); a store that is down
    costs the record, not the answer."""
    principal = state["principal"]
    event = NewEvent(
        "audit.permission_deny",
        {
            "user_uuid": principal.user_uuid,
            "permission": f"{method} {route}",
            "reason": state.get("denied") or "forbidden",
            "denied_by": "api",
            "request_id": request_id,
        },
        principal.user_uuid,
    )
    try:
        await ctx.events.append([event])
    except Exception:  # noqa: BLE001 - recorded as a warning, the answer is already sent
        log.warning("audit.permission_deny not recorded (request_id=%s)", request_id)
