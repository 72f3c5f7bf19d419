"""What a replica holds: settings, the database, Redis, auth, metrics. Built in the lifespan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import redis.asyncio as aioredis

from orchestrator.auth import Authenticator, FailedAuthThrottle, RateLimiter, TokenStore
from orchestrator.channels import ChannelRunner, ChannelStore, InboundLimits
from orchestrator.config import Settings
from orchestrator.db import Database
from orchestrator.events import EventStore, Fanout
from orchestrator.inference import InferenceService
from orchestrator.marketplace import Marketplace
from orchestrator.memory import MemoryStore
from orchestrator.observability import (
    MetricsPusher,
    MetricsRecorder,
    MetricsSnapshot,
    MetricsState,
    SloQuery,
    SloTargets,
)
from orchestrator.providers import Gateway, InferenceLog
from orchestrator.scheduler import JobStore
from orchestrator.tools import ToolCatalog, ToolStore
from orchestrator.toolset import AgentToolClients
from orchestrator.workflows import WorkflowStore
from orchestrator.workspace import Workspace

try:
    SERVICE_VERSION = version("orchestrator")
except PackageNotFoundError:  # running from a source tree that was not installed
    SERVICE_VERSION = "0.0.0+source"


class WorkflowRunner(Protocol):
    """Who drives workflows: the WorkflowShard actors under Ray, an in-process engine
    without."""

    async def start(self, workflow_id: str) -> None: ...
    async def cancel(self, workflow_id: str) -> str: ...
    async def close(self) -> None: ...


class MetricsHub(Protocol):
    """Where a replica's metric deltas go and the cluster-wide view comes from."""

    async def push(self, snapshot: MetricsSnapshot) -> None: ...
    async def render(self, event_totals: dict[str, int] | None = None) -> bytes: ...
    async def slo(self, query: SloQuery) -> dict[str, Any]: ...
    async def gauges(self) -> dict[str, int]: ...


class LocalMetricsHub:
    """In-process aggregation, for an app served without Ray (tests, plain uvicorn)."""

    def __init__(self) -> None:
        self.state = MetricsState()

    async def push(self, snapshot: MetricsSnapshot) -> None:
        self.state.apply(snapshot)

    async def render(self, event_totals: dict[str, int] | None = None) -> bytes:
        return self.state.render(event_totals)

    async def slo(self, query: SloQuery) -> dict[str, Any]:
        return self.state.slo(query.targets, query.uptime_ratio)

    async def gauges(self) -> dict[str, int]:
        return {
            "stream_sockets": self.state.stream_sockets(),
            "active_workers": self.state.active_workers(),
        }


@dataclass
class AppContext:
    settings: Settings
    db: Database
    redis: aioredis.Redis
    tokens: TokenStore
    authenticator: Authenticator
    rate_limiter: RateLimiter
    auth_throttle: FailedAuthThrottle
    recorder: MetricsRecorder
    metrics: MetricsHub
    events: EventStore
    fanout: Fanout = field(init=False)
    gateway: Gateway = field(init=False)
    inference_log: InferenceLog = field(init=False)
    inference: InferenceService = field(init=False)
    workflows: WorkflowStore = field(init=False)
    jobs: JobStore = field(init=False)
    memory: MemoryStore = field(init=False)
    workspace: Workspace = field(init=False)
    marketplace: Marketplace = field(init=False)
    channels: ChannelStore = field(init=False)
    channel_runner: ChannelRunner = field(init=False)
    channel_limits: InboundLimits = field(init=False)
    tool_store: ToolStore = field(init=False)
    tool_catalog: ToolCatalog = field(init=False)
    tool_clients: AgentToolClients = field(init=False)  # .mcp: the MCP pool, made on first use
    teams_verifiers: dict[Any, Any] = field(default_factory=dict)
    workflow_runner: WorkflowRunner = field(init=False)
    worker_pool: int = 1  # AgentWorker actors (for /health workers.idle)
    started_at: float = field(default_factory=time.time)
    _pusher: MetricsPusher | None = None

    @property
    def slo_targets(self) -> SloTargets:
        s = self.settings
        return SloTargets(
            latency_p99_s=s.slo_latency_p99_s,
            uptime_7d_pct=s.slo_uptime_7d_pct,
            error_rate=s.slo_error_rate,
            window_s=s.slo_window_s,
        )

    async def flush_metrics(self) -> None:
        if self._pusher is None:
            self._pusher = MetricsPusher(self.recorder, self.metrics)
        await self._pusher.flush()
