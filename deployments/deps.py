"""Typed dependencies every handler uses, over plain functions a route that resolves no
dependencies (deployments/json_route.py) calls itself: one way to reach the context and the
caller, whichever way a route is served."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from starlette.requests import HTTPConnection

from deployments.context import AppContext
from orchestrator.auth import Principal
from orchestrator.errors import Forbidden, Unauthorized

# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread
# pool, a thread hand-off per request that profiling showed to dominate a trivial route.


def context_of(conn: HTTPConnection) -> AppContext:
    return conn.app.state.ctx  # type: ignore[no-any-return]


def principal_of(conn: HTTPConnection) -> Principal:
    """The caller the authentication layer admitted (deployments/layers/auth.py), on every
    path outside the public ones."""
    principal = conn.scope.get("state", {}).get("principal")
    if principal is None:
        raise Unauthorized("missing bearer token")
    return principal  # type: ignore[no-any-return]


async def get_context(request: Request) -> AppContext:
    return context_of(request)


async def current_principal(request: Request) -> Principal:
    return principal_of(request)


async def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("admin only")
    return principal


Ctx = Annotated[AppContext, Depends(get_context)]
CurrentUser = Annotated[Principal, Depends(current_principal)]
AdminUser = Annotated[Principal, Depends(admin_principal)]

BIGINT_MAX = 2**63 - 1  # Postgres bigint: larger values are a 400, not an overflow
Offset = Annotated[int, Query(ge=0, le=BIGINT_MAX, description="Items to skip")]
Position = Annotated[int, Query(ge=0, le=BIGINT_MAX)]
