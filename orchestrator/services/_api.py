"""The API replica's role: every service its routes and request layers use, and what serves
it from outside (`ApiPeers`). Apart from the actors' roles on purpose: actors never import
this module, so the settings read here (auth, SLOs, the pool of a replica) are not part of
the actors' generation version (actors/version.py, tests/unit/test_actor_settings.py)."""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.config import Settings
from orchestrator.observability import MetricsState
from orchestrator.services._core import Core, _fields

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import redis.asyncio as aioredis

    from orchestrator.auth import Authenticator, FailedAuthThrottle, RateLimiter, TokenStore
    from orchestrator.channels import (
        ChannelRunner,
        ChannelStore,
        InboundLimits,
        InterventionDesk,
        TeamsVerifiers,
    )
    from orchestrator.events import Event, Fanout
    from orchestrator.idempotency import IdempotencyStore
    from orchestrator.inference import InferenceService, LocalInference
    from orchestrator.interventions import InterventionStore
    from orchestrator.marketplace import Marketplace
    from orchestrator.memory import MemoryStore
    from orchestrator.observability import MetricsPusher, MetricsSnapshot, SloQuery, SloTargets
    from orchestrator.providers import Gateway, InferenceLog
    from orchestrator.responses import ResponseStore
    from orchestrator.runtime.supervisor import Supervisor
    from orchestrator.scheduler import JobStore, SchedulerService
    from orchestrator.teams import TeamStore
    from orchestrator.tools import ToolCatalog, ToolStore
    from orchestrator.toolset import AgentToolClients
    from orchestrator.workflows import WorkflowStore
    from orchestrator.workspace import Workspace


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


@dataclass(frozen=True)
class ApiPeers:
    """What serves an API replica from outside it: Ray actors under Serve, None without (then
    the replica runs each in its own process). `metrics`: the cluster-wide hub;
    `event_upstream`: the live event subscription (an empty batch first, once subscribed:
    the Fanout's readiness); `local_inference`: runs inference
    instances (without it, POST /inference answers 503); `workflow_runner`: drives workflows
    (without it, an engine here with an in-process agent runner); `run_scheduler`: whether
    the scheduler runs here; `channel_runner`: answers channel messages (without it, a relay
    here); `started_at`: the service's start, for /health's uptime."""

    metrics: MetricsHub
    event_upstream: Callable[[int], AsyncIterator[list[Event]]] | None = None
    local_inference: LocalInference | None = None
    workflow_runner: WorkflowRunner | None = None
    run_scheduler: bool = True
    channel_runner: ChannelRunner | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class ApiServices(Core):
    """An API replica: every service its routes and request layers use. `scheduler` is
    started by the replica's lifespan (with its other loops), when it runs here. Its pool:
    the settings' `db_pool_min`/`db_pool_max`."""

    redis: aioredis.Redis
    tokens: TokenStore
    authenticator: Authenticator
    rate_limiter: RateLimiter
    auth_throttle: FailedAuthThrottle
    metrics: MetricsHub
    pusher: MetricsPusher
    slo_targets: SloTargets
    gateway: Gateway
    inference_log: InferenceLog
    inference: InferenceService
    workflows: WorkflowStore
    jobs: JobStore
    memory: MemoryStore
    workspace: Workspace
    marketplace: Marketplace
    idempotency: IdempotencyStore  # Idempotency-Key of the creating POSTs (issue 32)
    responses: ResponseStore  # stored answers of POST /responses (issue 34)
    interventions: InterventionStore  # decisions workflow steps wait for (issue 32)
    tool_store: ToolStore
    tool_clients: AgentToolClients  # .mcp: the MCP pool, made on first use
    tool_catalog: ToolCatalog
    workflow_runner: WorkflowRunner
    scheduler: SchedulerService | None
    channels: ChannelStore
    channel_runner: ChannelRunner
    channel_limits: InboundLimits
    intervention_desk: InterventionDesk  # presses and signed links from channels (issue 32)
    teams_verifiers: TeamsVerifiers
    teams: TeamStore  # agent teams (issue 33): GET /teams/{id}
    fanout: Fanout
    worker_pool: int  # AgentWorker actors (for /health workers.idle)
    started_at: float

    @classmethod
    def _pool(cls, settings: Settings) -> tuple[int, int]:
        return settings.db_pool_min, settings.db_pool_max

    @classmethod
    async def _build(
        cls,
        core: Core,
        stack: contextlib.AsyncExitStack,
        *,
        supervisor: Supervisor | None = None,
        peers: ApiPeers | None = None,
        **_: Any,
    ) -> ApiServices:
        assert supervisor is not None and peers is not None, "an API replica needs both"
        return cls(**_fields(core), **await _api(core, stack, supervisor, peers))


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


async def _api(
    core: Core, stack: contextlib.AsyncExitStack, supervisor: Supervisor, peers: ApiPeers
) -> dict[str, Any]:
    """An API replica's own services (beside the core), in the order of the closes their
    unwinding needs (the stack unwinds in reverse)."""
    import redis.asyncio as aioredis

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
        ChannelStore,
        EgressPolicy,
        InboundLimits,
        InterventionDesk,
        InterventionPoster,
        LocalChannels,
        PostStore,
        TeamsVerifiers,
        channel_egress,
    )
    from orchestrator.events import EventServices, Fanout
    from orchestrator.idempotency import IdempotencyStore
    from orchestrator.inference import InferenceService, ready_endpoints
    from orchestrator.interventions import InterventionStore, LinkSigner, link_key
    from orchestrator.marketplace import Marketplace
    from orchestrator.memory import MemoryStore, make_embedder
    from orchestrator.memory._embed import EmbeddingLimits
    from orchestrator.observability import MetricsPusher, SloTargets
    from orchestrator.providers import Gateway, InferenceLog
    from orchestrator.responses import ResponseStore
    from orchestrator.scheduler import JobStore, SchedulerService
    from orchestrator.secret_box import configured_box
    from orchestrator.teams import MailWaker, TeamHub, TeamStore
    from orchestrator.tools import ToolLimits, ToolStore
    from orchestrator.toolset import AgentToolClients
    from orchestrator.workflows import WorkflowEngine, WorkflowStore
    from orchestrator.workspace import Workspace

    s, db, events, recorder = core.settings, core.db, core.events, core.recorder
    if not s.redis_url:
        raise RuntimeError("redis_url must be set before the app starts")
    redis = aioredis.from_url(
        s.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=15
    )
    stack.push_async_callback(redis.aclose)
    tokens = TokenStore(db.pool)
    jwt_verifier = JwtVerifier(
        secret=_secret(s.jwt_secret),
        jwks_url=s.jwt_jwks_url,
        issuer=s.jwt_issuer,
        audience=s.jwt_audience,
        user_claim=s.jwt_user_claim,
        admin_claim=s.jwt_admin_claim,
    )
    gateway = Gateway(s, recorder, local=lambda: ready_endpoints(db.pool))
    stack.push_async_callback(gateway.aclose)
    inference_log = InferenceLog(events, flush_s=s.inference_log_flush_s, recorder=recorder)
    stack.push_async_callback(inference_log.drain)
    # A safety net: whatever is still running when the unwind reaches here is cancelled,
    # awaited (the lifespan closes the supervisor first, before what its loops use).
    stack.push_async_callback(supervisor.aclose)
    memory = MemoryStore(
        db.pool,
        events,
        redis,
        s.memory_embedding_dim,
        pgvector=db.pgvector,
        embedder=make_embedder(
            s.embedder, gateway, s.embedder_threads, EmbeddingLimits.for_provider(s)
        ),
        ef_search=s.memory_hnsw_ef_search,
        supervisor=supervisor,
        key_scope=s.memory_key_scope,
        admin_delete=s.memory_admin_delete,
    )
    await memory.prepare()
    # Its writes still in flight finish and its owed cache DELs go out before Redis closes.
    stack.push_async_callback(memory.settle)
    workspace = Workspace(s)
    marketplace = Marketplace.of(db.pool, s)
    box = configured_box(s)
    # Users' MCP servers, HTTP tools and tool policies; their secrets sealed by the box that
    # seals the channels'. This process calls them when it runs tasks itself (served without
    # Ray) and lists an MCP server's tools when one is registered.
    tool_store = ToolStore(db.pool, box, events=events, limits=ToolLimits.of(s))
    tool_clients = AgentToolClients(s)
    stack.push_async_callback(tool_clients.aclose)
    tool_catalog = tool_clients.catalog(db.pool, tool_store)
    interventions = InterventionStore(db.pool, events, default_timeout_s=s.intervention_timeout_s)
    # Agent teams (issue 33): members run through this process's dispatcher, made below.
    teams = TeamStore(db.pool, events)
    waker = MailWaker(s.database_url, s.team_receive_poll_s)
    stack.push_async_callback(waker.close)
    team_hub = TeamHub(teams, s, lambda task: dispatcher.run(task), waker)
    agents = AgentRunner(
        s,
        gateway,
        events,
        tool_catalog,
        {
            "pool": db.pool,
            "events": events,
            "memory": memory,
            "workspace": workspace,
            "marketplace": marketplace,
            "teams": team_hub,
        },
        interventions=interventions,
        box=box,
    )
    dispatcher = LocalDispatcher(agents, on_busy=recorder.active_workers)
    workflows = WorkflowStore(db.pool, events)
    jobs = JobStore(db.pool, events)
    scheduler: SchedulerService | None = None
    if peers.run_scheduler:
        scheduler = SchedulerService(jobs, dispatcher, s, s.database_url or "", supervisor)
        stack.push_async_callback(scheduler.shutdown)
    runner = peers.workflow_runner
    worker_pool = 1
    if runner is None:
        engine = WorkflowEngine(
            workflows, dispatcher, s, supervisor=supervisor, interventions=interventions
        )
        stack.push_async_callback(engine.close)
        await engine.resume_unfinished()
        runner = engine
    else:
        stack.push_async_callback(runner.close)
        worker_pool = s.agent_workers
    channels = ChannelStore(
        db.pool,
        box,
        teams_audience=s.teams_audience,
        egress=EgressPolicy(s.outbound_allowed_cidrs),
    )
    # Channel calls from this process: deliveries and questions without Ray, and answers to
    # a Slack press (its response_url) either way.
    egress = channel_egress(s)
    stack.push_async_callback(egress.aclose)
    signer = LinkSigner(link_key(s))
    channel_runner = peers.channel_runner
    if channel_runner is None:
        relay = ChannelRelay(channels, dispatcher, s, egress)
        poster = InterventionPoster(
            PostStore(db.pool), interventions, channels, s, egress, signer=signer
        )
        channel_runner = LocalChannels(relay, supervisor, poster)
    stack.push_async_callback(channel_runner.close)
    desk = InterventionDesk(
        interventions,
        channels,
        runner,
        egress,
        signer,
        bases=s.channel_api_base_urls,
        on_decided=channel_runner.wake_posts,
    )
    stack.push_async_callback(desk.close)
    pusher = MetricsPusher(recorder, peers.metrics)

    async def last_flush() -> None:
        with contextlib.suppress(Exception):
            await pusher.flush()

    stack.push_async_callback(last_flush)
    upstream = peers.event_upstream
    if upstream is None:
        # Served without Ray: follow the store in this process (and count its events).
        local_events = EventServices(events, s.database_url or "", recorder, supervisor)
        stack.push_async_callback(local_events.stop)
        await local_events.start()
        upstream = functools.partial(local_events.feed.subscribe, announce=True)
    fanout = Fanout(
        upstream,
        events,
        client_limit=s.sse_client_buffer,
        on_clients=recorder.stream_sockets,
        supervisor=supervisor,
    )
    stack.push_async_callback(fanout.close)
    return {
        "redis": redis,
        "tokens": tokens,
        "authenticator": Authenticator(
            tokens, jwt_verifier, s.auth_cache_ttl_s, s.auth_cache_max_entries
        ),
        "rate_limiter": RateLimiter(redis, s.rate_limit_per_minute, sync_s=s.rate_limit_sync_s),
        "auth_throttle": FailedAuthThrottle(
            redis, s.auth_failures_per_address, s.auth_failure_window_s
        ),
        "metrics": peers.metrics,
        "pusher": pusher,
        "slo_targets": SloTargets(
            latency_p99_s=s.slo_latency_p99_s,
            uptime_7d_pct=s.slo_uptime_7d_pct,
            error_rate=s.slo_error_rate,
            window_s=s.slo_window_s,
        ),
        "gateway": gateway,
        "inference_log": inference_log,
        "inference": InferenceService(s, events, peers.local_inference),
        "workflows": workflows,
        "jobs": jobs,
        "memory": memory,
        "workspace": workspace,
        "marketplace": marketplace,
        "idempotency": IdempotencyStore(db.pool, s.idempotency_ttl_s),
        "responses": ResponseStore(db.pool, s.response_retention_s),
        "interventions": interventions,
        "tool_store": tool_store,
        "tool_clients": tool_clients,
        "tool_catalog": tool_catalog,
        "workflow_runner": runner,
        "scheduler": scheduler,
        "channels": channels,
        "channel_runner": channel_runner,
        "channel_limits": InboundLimits(redis, s),
        "intervention_desk": desk,
        "teams_verifiers": TeamsVerifiers(s.teams_jwks_url, s.teams_issuer),
        "teams": teams,
        "fanout": fanout,
        "worker_pool": worker_pool,
        "started_at": peers.started_at if peers.started_at is not None else time.time(),
    }
