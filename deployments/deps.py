"""Typed dependencies the handlers use, one per service (a handler names only what it uses),
over plain functions a route that resolves no dependencies (deployments/json_route.py) calls
itself: one way to reach the services and the caller, whichever way a route is served.

The services are the replica's `ApiServices` (orchestrator/services/), built completely
before the app serves and kept on `app.state.services`."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import Depends, Query, Request
from starlette.requests import HTTPConnection

from orchestrator.auth import Authenticator, Principal, TokenStore
from orchestrator.channels import ChannelRunner, ChannelStore, InboundLimits, TeamsVerifiers
from orchestrator.config import Settings
from orchestrator.db import Database
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.events import EventStore, Fanout
from orchestrator.inference import InferenceService
from orchestrator.marketplace import Marketplace
from orchestrator.memory import MemoryStore
from orchestrator.observability import MetricsPusher, SloTargets
from orchestrator.providers import Gateway, InferenceLog
from orchestrator.scheduler import JobStore
from orchestrator.services import ApiServices, MetricsHub, WorkflowRunner
from orchestrator.tools import ToolCatalog, ToolStore
from orchestrator.toolset import AgentToolClients
from orchestrator.workflows import WorkflowStore
from orchestrator.workspace import Workspace

# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread
# pool, a thread hand-off per request that profiling showed to dominate a trivial route.


def services_of(conn: HTTPConnection) -> ApiServices:
    return conn.app.state.services  # type: ignore[no-any-return]


def principal_of(conn: HTTPConnection) -> Principal:
    """The caller the authentication layer admitted (deployments/layers/auth.py), on every
    path outside the public ones."""
    principal = conn.scope.get("state", {}).get("principal")
    if principal is None:
        raise Unauthorized("missing bearer token")
    return principal  # type: ignore[no-any-return]


async def current_principal(request: Request) -> Principal:
    return principal_of(request)


async def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("admin only")
    return principal


def _service(name: str) -> Any:
    """`Depends` on the replica's service `name` (a field of ApiServices: checked here, at
    import, so a misspelt one fails at once rather than on its route's first request)."""
    if name not in _API_FIELDS:
        raise AttributeError(f"ApiServices has no {name!r}")

    async def service(request: Request) -> Any:
        return getattr(request.app.state.services, name)

    service.__name__ = f"{name}_dep"
    return Depends(service)


_API_FIELDS = frozenset(f.name for f in dataclasses.fields(ApiServices))

CurrentUser = Annotated[Principal, Depends(current_principal)]
AdminUser = Annotated[Principal, Depends(admin_principal)]

Auth = Annotated[Authenticator, _service("authenticator")]
Config = Annotated[Settings, _service("settings")]
Db = Annotated[Database, _service("db")]
Redis = Annotated[aioredis.Redis, _service("redis")]
Events = Annotated[EventStore, _service("events")]
Feed = Annotated[Fanout, _service("fanout")]
Tokens = Annotated[TokenStore, _service("tokens")]
Metrics = Annotated[MetricsHub, _service("metrics")]
Pusher = Annotated[MetricsPusher, _service("pusher")]
Slo = Annotated[SloTargets, _service("slo_targets")]
WorkerPool = Annotated[int, _service("worker_pool")]
StartedAt = Annotated[float, _service("started_at")]
ModelGateway = Annotated[Gateway, _service("gateway")]
InferenceRecords = Annotated[InferenceLog, _service("inference_log")]
Inference = Annotated[InferenceService, _service("inference")]
Workflows = Annotated[WorkflowStore, _service("workflows")]
WorkflowDriver = Annotated[WorkflowRunner, _service("workflow_runner")]
Jobs = Annotated[JobStore, _service("jobs")]
Memory = Annotated[MemoryStore, _service("memory")]
Files = Annotated[Workspace, _service("workspace")]
Market = Annotated[Marketplace, _service("marketplace")]
Channels = Annotated[ChannelStore, _service("channels")]
ChannelDriver = Annotated[ChannelRunner, _service("channel_runner")]
ChannelLimits = Annotated[InboundLimits, _service("channel_limits")]
TeamsVerifierCache = Annotated[TeamsVerifiers, _service("teams_verifiers")]
Tools = Annotated[ToolStore, _service("tool_store")]
Catalog = Annotated[ToolCatalog, _service("tool_catalog")]
ToolClients = Annotated[AgentToolClients, _service("tool_clients")]

BIGINT_MAX = 2**63 - 1  # Postgres bigint: larger values are a 400, not an overflow
Offset = Annotated[int, Query(ge=0, le=BIGINT_MAX, description="Items to skip")]
Position = Annotated[int, Query(ge=0, le=BIGINT_MAX)]
