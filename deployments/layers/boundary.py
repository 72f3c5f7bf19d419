"""The error boundary: an exception out of the layers inside it (a refusal before any route
ran: 401, 413, 421, 429, a 400 of the input guard) or out of a route without a handler of
its own (a bug, a dependency that is down) becomes the answer the app's exception handlers
give (deployments/errors.py `install_error_handlers`), the same handlers FastAPI applies to
the routes: one place turns errors into HTTP, whichever layer raised them.

Starlette's own last resort (ServerErrorMiddleware) is outside every layer: it would answer
before the request's id and records are known, and re-raise to the server. An exception
after the answer began cannot be answered: it passes on (the server ends the connection).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ErrorBoundary:
    def __init__(self, app: ASGIApp, handlers: Mapping[Any, Any]) -> None:
        self.app = app
        # The app's own mapping, read per error: a handler installed later applies here too.
        self._handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            handler = self._handler(exc)
            if started or handler is None:
                raise
            request = Request(scope, receive)
            if inspect.iscoroutinefunction(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
            await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Any:
        for cls in type(exc).__mro__:
            handler = self._handlers.get(cls)
            if handler is not None:
                return handler
        return None
