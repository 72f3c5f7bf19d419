"""Request id, authentication, rate limiting and request metrics, as one pure ASGI layer.

Pure ASGI (not BaseHTTPMiddleware) because it sits on every request's path.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.errors import error_response, internal_error_response
from orchestrator.errors import OrchestratorError
from orchestrator.observability import RouteTemplates

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContextMiddleware:
    def __init__(
        self, app: ASGIApp, ctx_getter: Any, templates: RouteTemplates, echo_request_id: bool
    ) -> None:
        self.app = app
        self._ctx = ctx_getter
        self._templates = templates
        # Serve's proxy already answers with X-Request-ID (the id it put in the request headers).
        self._echo = echo_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        incoming = _header(scope, b"x-request-id")
        request_id = incoming if incoming and _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500
        rid_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self._echo:
                    message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        ctx = self._ctx()
        try:
            path = scope["path"]
            if path not in ctx.settings.exempt_paths:
                principal = await ctx.authenticator.authenticate(_header(scope, b"authorization"))
                state["principal"] = principal
                if ctx.rate_limiter.enabled:
                    await ctx.rate_limiter.hit(principal.subject or principal.user_uuid)
            await self.app(scope, receive, send_with_id)
        except OrchestratorError as exc:
            response = error_response(exc, request_id)
            await response(scope, receive, send_with_id)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: log, answer 500
            response = internal_error_response(exc, request_id)
            await response(scope, receive, send_with_id)
        finally:
            ctx.recorder.http_request(
                scope["method"], self._templates.match(scope["path"]), status,
                time.perf_counter() - started,
            )
