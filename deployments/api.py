"""The FastAPI application of one replica. No Ray here: Serve wraps it in `deployments.app`,
and tests or plain uvicorn can run it as is. Its services are built by the composition root
(`orchestrator.services.build_services`, role `ApiServices`) before it serves; the lifespan
then only starts the replica's loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from deployments.errors import install_error_handlers
from deployments.layers import install as install_layers
from deployments.layers import request_layers
from deployments.routers import ROUTERS, responses
from deployments.routers.gateway import MODEL_ENDPOINTS, add_model_routes
from deployments.ui import mount as mount_ui
from orchestrator import SERVICE_VERSION
from orchestrator.channels import ChannelRunner
from orchestrator.config import Settings
from orchestrator.events._fanout import Upstream
from orchestrator.inference import LocalInference
from orchestrator.observability import (
    LOG_FLUSH_S,
    MetricsRecorder,
    RouteTemplates,
    flush_buffered_logs,
    heartbeat,
    prune_heartbeats,
)
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.services import (
    ApiPeers,
    ApiServices,
    LocalMetricsHub,
    MetricsHub,
    WorkflowRunner,
    build_services,
)

log = logging.getLogger("orchestrator.api")

API_PREFIX = "/api/v1"
METRICS_FLUSH_S = 1.0
HEARTBEAT_S = 20.0


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
    peers = ApiPeers(
        metrics=metrics or LocalMetricsHub(),
        event_upstream=event_upstream,
        local_inference=local_inference,
        workflow_runner=workflow_runner,
        run_scheduler=run_scheduler,
        channel_runner=channel_runner,
        started_at=started_at,
    )
    holder: dict[str, ApiServices] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Each part is registered on the stack as soon as it has started, so a start that
        # fails halfway unwinds exactly what started (in reverse), as shutdown does.
        async with contextlib.AsyncExitStack() as stack:
            if local_inference is not None:
                stack.push_async_callback(local_inference.close)
            recorder = MetricsRecorder(f"api:{socket.gethostname()}:{os.getpid()}")
            supervisor = Supervisor("api", on_restart=recorder.background_restart)
            app.state.supervisor = supervisor
            services = await build_services(
                settings,
                ApiServices,
                stack,
                recorder=recorder,
                supervisor=supervisor,
                peers=peers,
            )
            holder["services"] = services
            app.state.services = services
            await _start_loops(services, supervisor, stack)
            yield

    async def _start_loops(
        services: ApiServices, supervisor: Supervisor, stack: contextlib.AsyncExitStack
    ) -> None:
        s = services

        async def beat() -> None:
            await heartbeat(s.db.pool)
            await prune_heartbeats(s.db.pool)
            # The housekeeping that rides on the heartbeat: expired idempotency keys (issue
            # 32) and stored responses (issue 34); reads check expiry too, so this only
            # bounds the tables.
            await s.idempotency.purge_expired()
            await s.responses.purge_expired()

        if settings.admin_token is not None:
            await s.tokens.register_configured_admin(settings.admin_token.get_secret_value())
        with contextlib.suppress(Exception):
            await heartbeat(s.db.pool)
        # Shutdown stops the loops (they use everything the services hold) and awaits them
        # before the services close. The stack runs last in, first out: what is pushed below
        # (`last_uses`) runs before this, while the loops still run.
        stack.push_async_callback(supervisor.aclose)
        supervisor.spawn(
            "metrics-flush", lambda: _every(METRICS_FLUSH_S, "metrics flush", s.pusher.flush)
        )
        # Gateway calls' inference.* records, written in batches after the responses.
        supervisor.spawn("inference-log", s.inference_log.run)
        # Serve buffers a replica's log lines (1,000 at a time): written at least every second.
        supervisor.spawn("log-flush", lambda: _every(LOG_FLUSH_S, "log flush", _flush_logs))
        if s.scheduler is not None:
            s.scheduler.start()
        supervisor.spawn("heartbeat", lambda: _every(HEARTBEAT_S, "heartbeat", beat))
        # Revoked tokens leave every replica's auth cache by NOTIFY (no cache while it is down).
        supervisor.spawn(
            "token-listener", lambda: s.authenticator.watch(settings.database_url or "")
        )
        # Tokens' last use, written once a minute in a batch (never on the request path).
        supervisor.spawn("token-last-used", s.authenticator.record_use)

        # At shutdown, before the loops stop (see above): what `token-last-used` has not
        # written yet. The loop may write a batch at the same time: harmless, a token's
        # last use never moves back (TokenStore.record_use).
        async def last_uses() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await s.authenticator.flush_last_used()

        stack.push_async_callback(last_uses)
        if s.rate_limiter.enabled:
            supervisor.spawn("rate-limit-sync", s.rate_limiter.run)
        if s.channel_limits.enabled:
            supervisor.spawn("channel-limit-sync", s.channel_limits.run)
        if s.memory.embedder:
            supervisor.spawn("memory-filler", s.memory.run_filler)

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
    model_routes = MODEL_ENDPOINTS + responses.MODEL_ENDPOINTS
    add_model_routes(app.router, API_PREFIX, model_routes)  # first of the app's routes
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    # The web console's static files (no token: its data calls are the API's own, above).
    mount_ui(app)
    templates = RouteTemplates(
        [API_PREFIX + path for path, _ in model_routes]
        + [API_PREFIX + route.path for router in ROUTERS for route in router.routes]  # type: ignore[attr-defined]
        + [app.openapi_url or "", app.docs_url or ""]
        + ["/ui", "/ui/", "/ui/{file:path}"]  # the console's files: one label, not one a file
    )
    app.state.route_templates = templates  # also for the edge's 500s (deployments/app.py)
    layers = request_layers(
        settings,
        services_getter=lambda: holder["services"],
        templates=templates,
        echo_request_id=echo_request_id,
        handlers=app.exception_handlers,
    )
    install_layers(app, layers)
    return app
