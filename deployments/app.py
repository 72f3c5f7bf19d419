"""The Serve application: `build_app(args) -> Application`, named by serve_config.yaml."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from actors import Generation
from actors.channel_hub import RayChannels
from actors.event_bus import ActorEventSource
from actors.inference import RayLocalInference
from actors.metrics import ActorMetricsHub
from actors.workflow_shard import RayWorkflows
from deployments.api import create_app
from deployments.in_cluster import serve_request
from deployments.logs import log_like_serve, serve_logging_config
from deployments.runtime import runtime_deployment
from orchestrator.config import Settings
from orchestrator.wire.handle import HandleRequest, HandleResponse

APP_NAME = "orchestrator"


INGRESS = "Api"


@serve.deployment(name=INGRESS, max_ongoing_requests=256)
@serve.ingress()
class Api:
    """HTTP ingress replica: the FastAPI app, built on the replica after construction. It
    creates no actor: it reaches its version's generation, which the Runtime deployment owns,
    by name (so a replica restarting never makes a second generation)."""

    def __init__(
        self, settings: Settings, started_at: float, generation: Generation, runtime: Any
    ) -> None:
        self._settings = settings
        self._started_at = started_at
        self._generation = generation
        self._runtime = runtime  # bound so the Runtime deployment is part of the application
        log_like_serve(settings)

    def __serve_build_asgi_app__(self) -> FastAPI:
        generation = self._generation
        bus = ActorEventSource(generation)
        return create_app(
            self._settings,
            metrics=ActorMetricsHub(generation),
            event_upstream=bus.subscribe,
            started_at=self._started_at,
            echo_request_id=False,
            local_inference=RayLocalInference(self._settings, generation.app),
            workflow_runner=RayWorkflows(self._settings, generation),
            run_scheduler=False,
            channel_runner=RayChannels(self._settings, generation),
        )

    async def handle_request(self, request: HandleRequest) -> AsyncIterator[HandleResponse | bytes]:
        """A request from a program on the cluster, over this deployment's handle
        (orchestrator/sdk/_serve_transport.py): served by this replica's app, request layers
        and all, as HTTP is, so it acts as its token's principal and nothing more. Streamed
        (`handle.options(stream=True)`): the answer's head, then its body chunks."""
        key = self._settings.ingress_key
        app = self.app  # type: ignore[attr-defined]  # the ingress wrapper built and started it
        async for item in serve_request(app, request, key.get_secret_value() if key else None):
            yield item

    async def record_edge_error(self, method: str, path: str, duration_s: float) -> None:
        """A 500 answered before the app saw its request (deployments/edge.py, in Serve's
        proxy or a replica's HTTP server): counted as the app counts its own, in
        svc_http_requests_total{status="500"} and the SLO's error rate. Async: the recorder
        is this replica's event loop's."""
        state = self.app.state  # type: ignore[attr-defined]
        route = state.route_templates.match(path)
        state.services.recorder.http_request(method, route, 500, duration_s)

    def __repr__(self) -> str:
        return f"Api(port={self._settings.port})"


def _settings_from_args(args: dict[str, Any]) -> Settings:
    given = args.get("settings")
    if isinstance(given, Settings):
        return given
    overrides = {k: v for k, v in args.items() if k not in ("config", "settings", "started_at")}
    settings = Settings.load(args.get("config"), **overrides)
    if not settings.database_url or not settings.redis_url:
        raise ValueError(
            "serve_config.yaml deployments need database_url and redis_url (ORCH_DATABASE_URL, "
            "ORCH_REDIS_URL): only `orchestrator serve` starts embedded servers"
        )
    return settings


def build_app(args: dict[str, Any]) -> Application:
    """Serve app builder. `args` holds a `Settings` (from the CLI) or settings keys and an
    optional `config` file path (from serve_config.yaml)."""
    settings = _settings_from_args(args)
    started_at = float(args.get("started_at") or time.time())
    deployment = Api.options(  # type: ignore[attr-defined]
        num_replicas=settings.api_replicas,
        max_ongoing_requests=settings.api_max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.api_replica_cpus},
        logging_config=serve_logging_config(settings),
    )
    # One version of the application: its code and the settings its actors read. Every actor
    # it runs carries it in its name, so a redeploy with other code or such settings gets new
    # actors (and one that changes only what the replicas read keeps them).
    generation = Generation.of(APP_NAME, settings)
    runtime = runtime_deployment(settings, generation).bind(settings, generation, INGRESS)
    app: Application = deployment.bind(settings, started_at, generation, runtime)
    return app
