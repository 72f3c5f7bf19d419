"""The Serve application: `build_app(args) -> Application`, named by serve_config.yaml."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.schema import LoggingConfig

from actors.agent_worker import ensure_agent_workers
from actors.channel_hub import RayChannels
from actors.event_bus import ActorEventSource
from actors.inference import RayLocalInference
from actors.metrics import ActorMetricsHub, get_or_create_metrics
from actors.scheduler import get_or_create_scheduler
from actors.workflow_shard import RayWorkflows
from deployments.api import create_app
from orchestrator.config import Settings

APP_NAME = "orchestrator"


def _log_like_serve(level: str) -> None:
    """Our loggers write where Serve writes this replica's log (logs/serve/replica_*.log,
    with the request id), and at our level: without this their records reached no handler
    and a 500's traceback was logged nowhere."""
    handlers = logging.getLogger("ray.serve").handlers
    for name in ("orchestrator", "deployments", "actors"):
        ours = logging.getLogger(name)
        ours.setLevel(level)
        for handler in handlers:
            if handler not in ours.handlers:
                ours.addHandler(handler)
        ours.propagate = False


@serve.deployment(name="Api", max_ongoing_requests=256)
@serve.ingress()
class Api:
    """HTTP ingress replica: the FastAPI app, built on the replica after construction."""

    def __init__(self, settings: Settings, started_at: float) -> None:
        self._settings = settings
        self._started_at = started_at
        _log_like_serve(settings.log_level)

    def __serve_build_asgi_app__(self) -> FastAPI:
        hub = ActorMetricsHub(get_or_create_metrics(self._settings.slo_window_s))
        bus = ActorEventSource(self._settings)
        bus.start()
        ensure_agent_workers(self._settings)
        workflows = RayWorkflows(self._settings)
        workflows.ensure_started()  # shards resume their unfinished workflows
        get_or_create_scheduler(self._settings).status.remote()
        channels = RayChannels(self._settings)
        channels.ensure_started()  # hubs pick up what their channels left in the inbox
        return create_app(
            self._settings,
            metrics=hub,
            event_upstream=bus.subscribe,
            started_at=self._started_at,
            echo_request_id=False,
            local_inference=RayLocalInference(self._settings),
            workflow_runner=workflows,
            run_scheduler=False,
            channel_runner=channels,
        )

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
        logging_config=LoggingConfig(
            enable_access_log=settings.access_log, log_level=settings.log_level
        ),
    )
    app: Application = deployment.bind(settings, started_at)
    return app
