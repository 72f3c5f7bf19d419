"""What each request leaves behind, once it is answered: its metrics
(svc_http_requests_total and the latency histograms, by route template), its access line,
and for a 403 answered to an authenticated caller an `audit.permission_deny` event.

Outside the error boundary, so it sees every answer's status, a refusal's included; a
client that went away before any answer is recorded as 499 (as nginx does), not as a
server error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.events import NewEvent
from orchestrator.observability import RouteTemplates, log_access

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499


class RequestRecords:
    def __init__(
        self,
        app: ASGIApp,
        services_getter: Callable[[], Any],
        templates: RouteTemplates,
        access_log: bool,
    ) -> None:
        self.app = app
        self._ctx = services_getter
        self._templates = templates
        self._access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            state = scope.get("state", {})
            method = scope["method"]
            route = self._templates.match(scope["path"])
            final = CLIENT_CLOSED if status is None else status
            ctx = self._ctx()
            principal = state.get("principal")
            if final == 403 and principal is not None:
                await _record_denial(ctx, state, method, route)
            elapsed = time.perf_counter() - started
            ctx.recorder.http_request(method, route, final, elapsed)
            if self._access_log:
                log_access(
                    request_id=state["request_id"],
                    client_request_id=state.get("client_request_id"),
                    user=principal.user_uuid if principal is not None else None,
                    method=method,
                    route=route,
                    status=final,
                    duration_ms=elapsed * 1000,
                )


async def _record_denial(ctx: Any, state: dict[str, Any], method: str, route: str) -> None:
    """audit.permission_deny: who, which route, why (`denied`, set by the app's handler of
    the refusal). After the answer went out (a 403 waits for nothing); a store that is down
    costs the record, not the answer."""
    principal = state["principal"]
    request_id = state.get("request_id")
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
