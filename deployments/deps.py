"""Typed dependencies every handler uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from deployments.context import AppContext
from orchestrator.auth import Principal
from orchestrator.errors import Forbidden, Unauthorized

# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread
# pool, a thread hand-off per request that profiling showed to dominate a trivial route.


async def get_context(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def current_principal(request: Request) -> Principal:
    # Set by the auth middleware on every path outside the exempt list.
    principal = getattr(request.state, "principal", None)
    if principal is None:
        raise Unauthorized("missing bearer token")
    return principal  # type: ignore[no-any-return]


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
