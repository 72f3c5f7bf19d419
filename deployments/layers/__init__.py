"""The layers every request passes before its route, outermost first, each a small pure ASGI
middleware (pure ASGI, not BaseHTTPMiddleware: they are on every request's path) with one
job:

1. `RequestContext`: the request's id, and whether it came through our proxy;
2. `RequestRecords`: its metrics, access line and denial audit, once answered;
3. `ErrorBoundary`: an exception from here in becomes the app's exception handlers' answer;
4. `IngressGuard`: 421 for a request that skipped our proxy (with an ingress key only);
5. `Authentication`: the caller (401 without one on a non-public path) and its rate limit;
6. `InputGuard`: size, text and JSON depth limits on every request's input.

Then FastAPI's routing: the model endpoints (JsonRoutes, deployments/json_route.py) first,
then the routers, inside FastAPI's own exception middleware, which answers a route's errors
with the same handlers as the boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.middleware import Middleware

from deployments.layers.auth import Authentication
from deployments.layers.boundary import ErrorBoundary
from deployments.layers.context import RequestContext
from deployments.layers.ingress import IngressGuard
from deployments.layers.input_guard import InputGuard
from deployments.layers.records import RequestRecords
from orchestrator.config import Settings
from orchestrator.observability import RouteTemplates


def request_layers(
    settings: Settings,
    *,
    services_getter: Callable[[], Any],
    templates: RouteTemplates,
    echo_request_id: bool,
    handlers: dict[Any, Any],
) -> list[Middleware]:
    """The layers, outermost first. `services_getter`: the replica's services (built in the
    lifespan); `handlers`: the app's exception handlers."""
    key = settings.ingress_key
    return [
        Middleware(
            RequestContext,
            echo_request_id=echo_request_id,
            ingress_key=key.get_secret_value() if key is not None else None,
        ),
        Middleware(
            RequestRecords,
            services_getter=services_getter,
            templates=templates,
            access_log=settings.access_log,
        ),
        Middleware(ErrorBoundary, handlers=handlers),
        # Without an ingress key (served without our HAProxy) there is nothing to refuse.
        *([Middleware(IngressGuard)] if key is not None else []),
        Middleware(
            Authentication,
            services_getter=services_getter,
            exempt_paths=settings.exempt_paths,
            trusted_proxies=settings.trusted_proxies,
        ),
        Middleware(InputGuard, max_bytes=settings.max_request_bytes),
    ]


def install(app: FastAPI, layers: list[Middleware]) -> None:
    """`layers` (outermost first) around `app`'s routes."""
    # Each middleware added goes outside those added before it.
    for cls, args, kwargs in reversed(layers):
        app.add_middleware(cls, *args, **kwargs)


__all__ = ["install", "request_layers"]
