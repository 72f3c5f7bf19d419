"""The FastAPI application of one replica. No Ray here: Serve wraps it in `deployments.app`,
and tests or plain uvicorn can run it as is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI

from deployments.context import (
    SERVICE_VERSION,
    AppContext,
    LocalMetricsHub,
    MetricsHub,
    WorkflowRunner,
)
from deployments.errors import install_error_handlers
from deployments.layers import install as install_layers
from deployments.layers import request_layers
from deployments.routers import ROUTERS
from deployments.routers.gateway import MODEL_ENDPOINTS, add_model_routes
from deployments.ui import mount as mount_ui
from orchestrator.agents import AgentRunner, LocalDispatcher
from orchestrator.auth import (
    Authenticator,
    FailedAuthThrottle,
    JwtVerifier,
    RateLimiter,
    TokenStore,
)
from orchestrator.channels import (
    ChannelRelay,
    ChannelRunner,
    ChannelStore,
    EgressPolicy,
    InboundLimits,
    LocalChannels,
    channel_egress,
)
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.events import EventServices, EventStore, Fanout
from orchestrator.events._fanout import Upstream
from orchestrator.inference import InferenceService, LocalInference, ready_endpoints
from orchestrator.marketplace import Marketplace
from orchestrator.memory import MemoryStore, make_embedder
from orchestrator.memory._embed import EmbeddingLimits
from orchestrator.observability import (
    LOG_FLUSH_S,
    MetricsRecorder,
    RouteTemplates,
    flush_buffered_logs,
    heartbeat,
    prune_heartbeats,
)
from orchestrator.providers import Gateway, InferenceLog
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.scheduler import JobStore, SchedulerService
from orchestrator.secret_box import configured_box
from orchestrator.tools import ToolLimits, ToolStore
from orchestrator.toolset import AgentToolClients
from orchestrator.workflows import WorkflowEngine, WorkflowStore
from orchestrator.workspace import Workspace

log = logging.getLogger("orchestrator.api")

API_PREFIX = "/api/v1"
METRICS_FLUSH_S = 1.0
HEARTBEAT_S = 20.0


def _secret(value: object) -> str | None:
    return value.get_secret_value() if value is not None else None  # type: ignore[attr-defined]


async def build_context(
    settings: Settings,
    metrics: MetricsHub,
    started_at: float | None,
    stack: contextlib.AsyncExitStack,
) -> AppContext:
    """The replica's context; what it opens is closed by `stack` (also if this fails)."""
    if not settings.database_url or not settings.redis_url:
        raise RuntimeError("database_url and redis_url must be set before the app starts")
    db = await connect(
        settings.database_url, min_size=settings.db_pool_min, max_size=settings.db_pool_max
    )
    stack.push_async_callback(db.close)
    redis = aioredis.from_url(
        settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=15
    )
    stack.push_async_callback(redis.aclose)
    tokens = TokenStore(db.pool)
    events = EventStore(db.pool)
    jwt_verifier = JwtVerifier(
        secret=_secret(settings.jwt_secret),
        jwks_url=settings.jwt_jwks_url,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        user_claim=settings.jwt_user_claim,
        admin_claim=settings.jwt_admin_claim,
    )
    ctx = AppContext(
        settings=settings,
        db=db,
        redis=redis,
        tokens=tokens,
        authenticator=Authenticator(
            tokens, jwt_verifier, settings.auth_cache_ttl_s, settings.auth_cache_max_entries
        ),
        rate_limiter=RateLimiter(
            redis, settings.rate_limit_per_minute, sync_s=settings.rate_limit_sync_s
        ),
        auth_throttle=FailedAuthThrottle(
            redis, settings.auth_failures_per_address, settings.auth_failure_window_s
        ),
        recorder=MetricsRecorder(f"api:{socket.gethostname()}:{os.getpid()}"),
        metrics=metrics,
        events=events,
    )
    if started_at is not None:
        ctx.started_at = started_at
    ctx.channel_limits = InboundLimits(redis, settings)
    ctx.gateway = Gateway(settings, ctx.recorder, local=lambda: ready_endpoints(db.pool))
    stack.push_async_callback(ctx.gateway.aclose)
    ctx.inference_log = InferenceLog(
        events, flush_s=settings.inference_log_flush_s, recorder=ctx.recorder
    )
    return ctx


async def _flush_logs() -> None:
    flush_buffered_logs()


async def _every(seconds: float, what: str, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await fn()
        except Exception as exc:  # noqa: BLE001 - a background duty must outlive a bad tick
            log.warning("%s failed: %r", what, exc)


def create_app(
    settings: Settings,
    *,
    metrics: MetricsHub | None = None,
    event_upstream: Upstream | None = None,
    started_at: float | None = None,
    echo_request_id: bool = True,
    local_inference: LocalInference | None = None,
    workflow_runner: WorkflowRunner | None = None,
    run_scheduler: bool = True,
    channel_runner: ChannelRunner | None = None,
) -> FastAPI:
    """Build the HTTP API. `metrics` is the cluster-wide hub and `event_upstream` the live
    event subscription (the Metrics and EventBus actors under Ray; in-process without);
    `echo_request_id` is False under Serve, whose proxy sets X-Request-ID on responses;
    `local_inference` runs inference instances (Ray actors under Serve; without it, POST
    /inference answers 503); `workflow_runner` drives workflows (the WorkflowShard actors
    under Serve; without it, an engine in this process with an in-process agent runner);
    `run_scheduler` runs the scheduler in this process (under Serve, the Scheduler actor
    does); `channel_runner` answers channel messages (the ChannelHub actors under Serve;
    without it, a relay in this process)."""
    hub = metrics or LocalMetricsHub()
    holder: dict[str, AppContext] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Each part is registered on the stack as soon as it has started, so a start that
        # fails halfway unwinds exactly what started (in reverse), as shutdown does.
        async with contextlib.AsyncExitStack() as stack:
            await _start(app, stack)
            yield

    async def _start(app: FastAPI, stack: contextlib.AsyncExitStack) -> None:
        if local_inference is not None:
            stack.push_async_callback(local_inference.close)
        ctx = await build_context(settings, hub, started_at, stack)
        holder["ctx"] = ctx
        app.state.ctx = ctx
        stack.push_async_callback(ctx.inference_log.drain)
        supervisor = Supervisor("api", on_restart=ctx.recorder.background_restart)
        app.state.supervisor = supervisor
        # A safety net: whatever is still running when the unwind ends is cancelled, awaited.
        stack.push_async_callback(supervisor.aclose)
        ctx.inference = InferenceService(settings, ctx.events, local_inference)
        ctx.workflows = WorkflowStore(ctx.db.pool, ctx.events)
        ctx.jobs = JobStore(ctx.db.pool, ctx.events)
        ctx.memory = MemoryStore(
            ctx.db.pool,
            ctx.events,
            ctx.redis,
            settings.memory_embedding_dim,
            pgvector=ctx.db.pgvector,
            embedder=make_embedder(
                settings.embedder,
                ctx.gateway,
                settings.embedder_threads,
                EmbeddingLimits.for_provider(settings),
            ),
            ef_search=settings.memory_hnsw_ef_search,
        )
        await ctx.memory.prepare()
        # Its queued cache write-backs go out before Redis closes (the stack unwinds in
        # reverse order).
        stack.push_async_callback(ctx.memory.settle)
        ctx.workspace = Workspace(settings)
        ctx.marketplace = Marketplace.of(ctx.db.pool, settings)
        box = configured_box(settings)
        # Users' MCP servers, HTTP tools and tool policies; their secrets sealed by the box
        # that seals the channels'. This process calls them when it runs tasks itself (served
        # without Ray) and lists an MCP server's tools when one is registered.
        ctx.tool_store = ToolStore(
            ctx.db.pool, box, events=ctx.events, limits=ToolLimits.of(settings)
        )
        tool_clients = AgentToolClients(settings)
        stack.push_async_callback(tool_clients.aclose)
        ctx.tool_clients = tool_clients
        ctx.tool_catalog = tool_clients.catalog(ctx.db.pool, ctx.tool_store)
        agents = AgentRunner(
            settings,
            ctx.gateway,
            ctx.events,
            ctx.tool_catalog,
            {
                "pool": ctx.db.pool,
                "events": ctx.events,
                "memory": ctx.memory,
                "workspace": ctx.workspace,
                "marketplace": ctx.marketplace,
            },
        )
        dispatcher = LocalDispatcher(agents, on_busy=ctx.recorder.active_workers)
        scheduler: SchedulerService | None = None
        if run_scheduler:
            scheduler = SchedulerService(
                ctx.jobs, dispatcher, settings, settings.database_url or "", supervisor
            )
            stack.push_async_callback(scheduler.shutdown)
        runner = workflow_runner
        if runner is None:
            engine = WorkflowEngine(ctx.workflows, dispatcher, settings, supervisor=supervisor)
            stack.push_async_callback(engine.close)
            await engine.resume_unfinished()
            runner = engine
        else:
            stack.push_async_callback(runner.close)
            ctx.worker_pool = settings.agent_workers
        ctx.workflow_runner = runner
        ctx.channels = ChannelStore(
            ctx.db.pool,
            box,
            teams_audience=settings.teams_audience,
            egress=EgressPolicy(settings.outbound_allowed_cidrs),
        )
        if channel_runner is None:
            egress = channel_egress(settings)
            stack.push_async_callback(egress.aclose)
            relay = ChannelRelay(ctx.channels, dispatcher, settings, egress)
            ctx.channel_runner = LocalChannels(relay, supervisor)
        else:
            ctx.channel_runner = channel_runner
        stack.push_async_callback(ctx.channel_runner.close)

        async def last_flush() -> None:
            with contextlib.suppress(Exception):
                await ctx.flush_metrics()

        stack.push_async_callback(last_flush)
        upstream = event_upstream
        if upstream is None:
            # Served without Ray: follow the store in this process (and count its events).
            local_events = EventServices(
                ctx.events, settings.database_url or "", ctx.recorder, supervisor
            )
            stack.push_async_callback(local_events.stop)
            await local_events.start()
            upstream = local_events.feed.subscribe
        ctx.fanout = Fanout(
            upstream,
            ctx.events,
            client_limit=settings.sse_client_buffer,
            on_clients=ctx.recorder.stream_sockets,
            supervisor=supervisor,
        )
        stack.push_async_callback(ctx.fanout.close)

        async def beat() -> None:
            await heartbeat(ctx.db.pool)
            await prune_heartbeats(ctx.db.pool)

        if settings.admin_token is not None:
            await ctx.tokens.register_configured_admin(settings.admin_token.get_secret_value())
        with contextlib.suppress(Exception):
            await heartbeat(ctx.db.pool)
        # Shutdown stops the loops first (they use everything above), and awaits them.
        stack.push_async_callback(supervisor.aclose)
        supervisor.spawn(
            "metrics-flush", lambda: _every(METRICS_FLUSH_S, "metrics flush", ctx.flush_metrics)
        )
        # Gateway calls' inference.* records, written in batches after the responses.
        supervisor.spawn("inference-log", ctx.inference_log.run)
        # Serve buffers a replica's log lines (1,000 at a time): written at least every second.
        supervisor.spawn("log-flush", lambda: _every(LOG_FLUSH_S, "log flush", _flush_logs))
        if scheduler is not None:
            scheduler.start()
        supervisor.spawn("heartbeat", lambda: _every(HEARTBEAT_S, "heartbeat", beat))
        # Revoked tokens leave every replica's auth cache by NOTIFY (no cache while it is down).
        supervisor.spawn(
            "token-listener", lambda: ctx.authenticator.watch(settings.database_url or "")
        )
        # Tokens' last use, written once a minute in a batch (never on the request path).
        supervisor.spawn("token-last-used", ctx.authenticator.record_use)

        async def last_uses() -> None:  # what the loop has not written yet, at shutdown
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await ctx.authenticator.flush_last_used()

        stack.push_async_callback(last_uses)
        if ctx.rate_limiter.enabled:
            supervisor.spawn("rate-limit-sync", ctx.rate_limiter.run)
        if ctx.channel_limits.enabled:
            supervisor.spawn("channel-limit-sync", ctx.channel_limits.run)
        if ctx.memory.embedder:
            supervisor.spawn("memory-filler", ctx.memory.run_filler)

    app = FastAPI(
        title="Agent orchestration service",
        version=SERVICE_VERSION,
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        # FastAPI's own OpenTelemetry hooks: off. The service has its request ids, access log
        # and metrics; and with them on, every request asks the global OpenTelemetry
        # providers whether they are configured (measured on the gateway's path).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_error_handlers(app)
    add_model_routes(app.router, API_PREFIX)  # first of the app's routes
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    # The web console's static files (no token: its data calls are the API's own, above).
    mount_ui(app)
    templates = RouteTemplates(
        [API_PREFIX + path for path, _ in MODEL_ENDPOINTS]
        + [API_PREFIX + route.path for router in ROUTERS for route in router.routes]  # type: ignore[attr-defined]
        + [app.openapi_url or "", app.docs_url or ""]
        + ["/ui", "/ui/", "/ui/{file:path}"]  # the console's files: one label, not one a file
    )
    app.state.route_templates = templates  # also for the edge's 500s (deployments/app.py)
    layers = request_layers(
        settings,
        ctx_getter=lambda: holder["ctx"],
        templates=templates,
        echo_request_id=echo_request_id,
        handlers=app.exception_handlers,
    )
    install_layers(app, layers)
    return app
