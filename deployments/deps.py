"""Typed dependencies the handlers use, one per service (a handler names only what it uses),
over plain functions a route that resolves no dependencies (deployments/json_route.py) calls
itself: one way to reach the services and the caller, whichever way a route is served.

The services are the replica's `ApiServices` (orchestrator/services/), built completely
before the app serves and kept on `app.state.services`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import redis.asyncio as aioredis
from fastapi import Depends, Header, Query, Request
from pydantic import BaseModel
from starlette.requests import HTTPConnection
from starlette.responses import Response

from orchestrator.auth import Authenticator, Principal, TokenStore
from orchestrator.channels import (
    ChannelRunner,
    ChannelStore,
    InboundLimits,
    InterventionDesk,
    TeamsVerifiers,
)
from orchestrator.config import Settings
from orchestrator.db import Database
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.events import EventStore, Fanout
from orchestrator.idempotency import (
    HEADER,
    NO_KEY,
    REPLAYED_HEADER,
    Answer,
    Replay,
    check_key,
    fingerprint,
)
from orchestrator.inference import InferenceService
from orchestrator.interventions import InterventionStore
from orchestrator.marketplace import Marketplace
from orchestrator.memory import MemoryStore
from orchestrator.observability import MetricsPusher, SloTargets
from orchestrator.providers import Gateway, InferenceLog
from orchestrator.responses import ResponseStore
from orchestrator.scheduler import JobStore
from orchestrator.services import ApiServices, MetricsHub, WorkflowRunner
from orchestrator.teams import TeamStore
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
StoredResponses = Annotated[ResponseStore, _service("responses")]
Workflows = Annotated[WorkflowStore, _service("workflows")]
WorkflowDriver = Annotated[WorkflowRunner, _service("workflow_runner")]
Interventions = Annotated[InterventionStore, _service("interventions")]
ChannelDesk = Annotated[InterventionDesk, _service("intervention_desk")]
Jobs = Annotated[JobStore, _service("jobs")]
Memory = Annotated[MemoryStore, _service("memory")]
Files = Annotated[Workspace, _service("workspace")]
Market = Annotated[Marketplace, _service("marketplace")]
Channels = Annotated[ChannelStore, _service("channels")]
ChannelDriver = Annotated[ChannelRunner, _service("channel_runner")]
ChannelLimits = Annotated[InboundLimits, _service("channel_limits")]
TeamsVerifierCache = Annotated[TeamsVerifiers, _service("teams_verifiers")]
TeamRecords = Annotated[TeamStore, _service("teams")]
Tools = Annotated[ToolStore, _service("tool_store")]
Catalog = Annotated[ToolCatalog, _service("tool_catalog")]
ToolClients = Annotated[AgentToolClients, _service("tool_clients")]

BIGINT_MAX = 2**63 - 1  # Postgres bigint: larger values are a 400, not an overflow
Offset = Annotated[int, Query(ge=0, le=BIGINT_MAX, description="Items to skip")]
Position = Annotated[int, Query(ge=0, le=BIGINT_MAX)]


A = TypeVar("A", bound=BaseModel)


class IdempotentCall:
    """A creating POST and its caller's `Idempotency-Key`, if sent (orchestrator/
    idempotency.py). The route hands its work to `run`: without a key it just runs; with
    one it runs once per key, and a retry gets the first answer again (`Idempotent-Replayed:
    true`). Claimed in `run`, not here: FastAPI resolves dependencies before it refuses a
    bad body, and a request it refuses must leave no claim behind."""

    def __init__(self, request: Request, principal: Principal, key: str | None) -> None:
        self._request = request
        self._principal = principal
        self.key = key

    async def run(self, operation: Callable[[Answer], Awaitable[A]]) -> A | Response:
        if self.key is None:
            return await operation(NO_KEY)
        request = self._request
        digest = fingerprint(request.method, request.url.path, await request.body())
        store = services_of(request).idempotency
        done = await store.run(self._principal.user_uuid, self.key, digest, operation)
        if isinstance(done, Replay):
            return Response(
                done.body,
                status_code=done.status_code,
                media_type="application/json",
                headers={REPLAYED_HEADER: "true"},
            )
        return done


async def idempotent_call(
    request: Request,
    principal: Annotated[Principal, Depends(current_principal)],
    key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            description="Makes a retry safe: the same key and body (yours, within "
            "idempotency_ttl_s, 24 h) answer the first response again, 200 with "
            "`Idempotent-Replayed: true`; another body: 409",
            # Documented here, checked by check_key (a 400 that names the header).
            json_schema_extra={"minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
        ),
    ] = None,
) -> IdempotentCall:
    return IdempotentCall(request, principal, None if key is None else check_key(key))


Idempotent = Annotated[IdempotentCall, Depends(idempotent_call)]
