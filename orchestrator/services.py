"""The composition root: `build_services(settings, role, stack)` wires every service a process
uses, in one place, for each kind of process (the API replica and each actor kind).

Why one builder: the API replica used to fill a mutable context field by field during its
start, and each actor wired its own slice of the same services again (its own pools, stores,
gateway), so a constructor change meant editing seven places and a service's set-up could
differ between them. Here a role is a frozen dataclass of what that process uses: a `Core`
every role has (settings, the database, the event store, the process's metrics recorder)
plus the role's own services. The builder opens only what the role uses (an EventBus opens
no gateway; the heavy modules are imported inside the role that needs them, so an actor's
start-up cost stays its own), registers each close on `stack` as soon as it is open (a
build that fails halfway closes what it opened, in reverse), and returns the services built
completely: nothing is assigned after, and state that changes while serving (the Teams
verifier cache, the metrics pusher) lives in objects built here.

No Ray here: what reaches Ray actors (dispatchers, shard routers) is built by the caller and
handed in (`ApiPeers`), or built by the actor around the services it gets.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from orchestrator.config import Settings
from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.observability import MetricsRecorder

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import httpx
    import redis.asyncio as aioredis

    from orchestrator.agents import AgentRunner
    from orchestrator.auth import Authenticator, FailedAuthThrottle, RateLimiter, TokenStore
    from orchestrator.channels import ChannelRunner, ChannelStore, InboundLimits, TeamsVerifiers
    from orchestrator.events import Event, Fanout
    from orchestrator.inference import InferenceService, InstanceStore, LocalInference
    from orchestrator.marketplace import Marketplace
    from orchestrator.memory import MemoryStore
    from orchestrator.observability import (
        MetricsPusher,
        MetricsSnapshot,
        SloQuery,
        SloTargets,
    )
    from orchestrator.providers import Gateway, InferenceLog
    from orchestrator.runtime.supervisor import Supervisor
    from orchestrator.scheduler import JobStore, SchedulerService
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


S = TypeVar("S", bound="Core")


@dataclass(frozen=True)
class Core:
    """What every process has. `POOL`: the role's Postgres connections (min, max); None: the
    settings' `db_pool_min`/`db_pool_max`."""

    POOL: ClassVar[tuple[int, int] | None] = None

    settings: Settings
    db: Database
    events: EventStore
    recorder: MetricsRecorder

    @classmethod
    async def _build(cls: type[S], core: Core, stack: contextlib.AsyncExitStack, **_: Any) -> S:
        return cls(**_fields(core))


def _fields(core: Core) -> dict[str, Any]:
    # Not dataclasses.asdict: that deep-copies the pool.
    return {f.name: getattr(core, f.name) for f in fields(Core)}


@dataclass(frozen=True)
class EventBusServices(Core):
    """The EventBus actor: its follower and projections are built on the core."""

    POOL = (1, 4)


@dataclass(frozen=True)
class InstanceServices(Core):
    """An InferenceInstance actor: the record of its instance."""

    POOL = (1, 2)

    instances: InstanceStore

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> InstanceServices:
        from orchestrator.inference import InstanceStore

        return cls(**_fields(core), instances=InstanceStore(core.events))


@dataclass(frozen=True)
class WorkflowShardServices(Core):
    """A WorkflowShard actor: the workflows' store (its engine is built by the actor, around
    the dispatcher to the agent workers). Its connections are shared by its drivers; their
    database work is admitted fairly across tenants (about twice this many at once)."""

    POOL = (1, 8)

    workflows: WorkflowStore

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> WorkflowShardServices:
        from orchestrator.workflows import WorkflowStore

        return cls(**_fields(core), workflows=WorkflowStore(core.db.pool, core.events))


@dataclass(frozen=True)
class SchedulerServices(Core):
    """The Scheduler actor: the jobs, and a second store on its own connections for runs'
    ends, so ticks never queue behind them."""

    POOL = (1, 6)

    jobs: JobStore
    run_jobs: JobStore

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> SchedulerServices:
        from orchestrator.scheduler import JobStore

        assert core.settings.database_url
        runs_db = await connect(core.settings.database_url, min_size=1, max_size=4, migrate=False)
        stack.push_async_callback(runs_db.close)
        return cls(
            **_fields(core),
            jobs=JobStore(core.db.pool, core.events),
            run_jobs=JobStore(runs_db.pool, EventStore(runs_db.pool)),
        )


@dataclass(frozen=True)
class ChannelHubServices(Core):
    """A ChannelHub actor: the channels (secrets sealed by the deployment's box) and the
    HTTP client deliveries go out through."""

    POOL = (1, 4)

    channels: ChannelStore
    egress: httpx.AsyncClient

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> ChannelHubServices:
        from orchestrator.channels import ChannelStore, EgressPolicy, channel_egress
        from orchestrator.secret_box import configured_box

        s = core.settings
        store = ChannelStore(
            core.db.pool, configured_box(s), egress=EgressPolicy(s.outbound_allowed_cidrs)
        )
        http = channel_egress(s)
        stack.push_async_callback(http.aclose)
        return cls(**_fields(core), channels=store, egress=http)


@dataclass(frozen=True)
class AgentWorkerServices(Core):
    """An AgentWorker actor: the agent loop and what its tools use. Entries agents store
    here are embedded by the replicas' fillers; writes drop the replicas' cached copies in
    the shared Redis. Users' MCP servers and HTTP tools are called from here: one MCP
    connection pool (and its stdio children) per worker process."""

    POOL = (1, 8)

    gateway: Gateway
    memory: MemoryStore
    tool_clients: AgentToolClients
    runner: AgentRunner

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> AgentWorkerServices:
        import redis.asyncio as aioredis

        from orchestrator.agents import AgentRunner
        from orchestrator.inference import ready_endpoints
        from orchestrator.marketplace import Marketplace
        from orchestrator.memory import MemoryStore
        from orchestrator.providers import Gateway
        from orchestrator.toolset import AgentToolClients
        from orchestrator.workspace import Workspace

        s, pool, events = core.settings, core.db.pool, core.events
        gateway = Gateway(s, core.recorder, local=lambda: ready_endpoints(pool))
        stack.push_async_callback(gateway.aclose)
        redis = None
        if s.redis_url:
            redis = aioredis.from_url(s.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
            stack.push_async_callback(redis.aclose)
        memory = MemoryStore(
            pool,
            events,
            redis,
            s.memory_embedding_dim,
            pgvector=core.db.pgvector,
            auto_embed=s.embedder != "none",
        )
        tool_clients = AgentToolClients(s)
        stack.push_async_callback(tool_clients.aclose)
        runner = AgentRunner(
            s,
            gateway,
            events,
            tool_clients.catalog(pool),
            {
                "pool": pool,
                "events": events,
                "memory": memory,
                "workspace": Workspace(s),
                "marketplace": Marketplace.of(pool, s),
            },
        )
        return cls(
            **_fields(core),
            gateway=gateway,
            memory=memory,
            tool_clients=tool_clients,
            runner=runner,
        )


@dataclass(frozen=True)
class ApiPeers:
    """What serves an API replica from outside it: Ray actors under Serve, None without (then
    the replica runs each in its own process). `metrics`: the cluster-wide hub;
    `event_upstream`: the live event subscription; `local_inference`: runs inference
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
    started by the replica's lifespan (with its other loops), when it runs here."""

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
    tool_store: ToolStore
    tool_clients: AgentToolClients  # .mcp: the MCP pool, made on first use
    tool_catalog: ToolCatalog
    workflow_runner: WorkflowRunner
    scheduler: SchedulerService | None
    channels: ChannelStore
    channel_runner: ChannelRunner
    channel_limits: InboundLimits
    teams_verifiers: TeamsVerifiers
    fanout: Fanout
    worker_pool: int  # AgentWorker actors (for /health workers.idle)
    started_at: float

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
        LocalChannels,
        TeamsVerifiers,
        channel_egress,
    )
    from orchestrator.events import EventServices, Fanout
    from orchestrator.inference import InferenceService, ready_endpoints
    from orchestrator.marketplace import Marketplace
    from orchestrator.memory import MemoryStore, make_embedder
    from orchestrator.memory._embed import EmbeddingLimits
    from orchestrator.observability import MetricsPusher, SloTargets
    from orchestrator.providers import Gateway, InferenceLog
    from orchestrator.scheduler import JobStore, SchedulerService
    from orchestrator.secret_box import configured_box
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
    )
    await memory.prepare()
    # Its queued cache write-backs go out before Redis closes.
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
        },
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
        engine = WorkflowEngine(workflows, dispatcher, s, supervisor=supervisor)
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
    channel_runner = peers.channel_runner
    if channel_runner is None:
        egress = channel_egress(s)
        stack.push_async_callback(egress.aclose)
        relay = ChannelRelay(channels, dispatcher, s, egress)
        channel_runner = LocalChannels(relay, supervisor)
    stack.push_async_callback(channel_runner.close)
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
        upstream = local_events.feed.subscribe
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
        "tool_store": tool_store,
        "tool_clients": tool_clients,
        "tool_catalog": tool_catalog,
        "workflow_runner": runner,
        "scheduler": scheduler,
        "channels": channels,
        "channel_runner": channel_runner,
        "channel_limits": InboundLimits(redis, s),
        "teams_verifiers": TeamsVerifiers(s.teams_jwks_url, s.teams_issuer),
        "fanout": fanout,
        "worker_pool": worker_pool,
        "started_at": peers.started_at if peers.started_at is not None else time.time(),
    }


async def build_services(
    settings: Settings,
    role: type[S],
    stack: contextlib.AsyncExitStack,
    *,
    recorder: MetricsRecorder,
    supervisor: Supervisor | None = None,
    peers: ApiPeers | None = None,
) -> S:
    """The services of a process of kind `role` (one of the dataclasses above), built
    completely; what they open is closed by `stack`, also when this fails halfway.
    `recorder`: the process's metrics recorder (an actor's is its host's);
    `supervisor` and `peers`: the API replica's (its loops and what Ray serves it)."""
    if not settings.database_url:
        raise RuntimeError("database_url must be set before the service starts")
    low, high = role.POOL or (settings.db_pool_min, settings.db_pool_max)
    db = await connect(settings.database_url, min_size=low, max_size=high)
    stack.push_async_callback(db.close)
    core = Core(settings=settings, db=db, events=EventStore(db.pool), recorder=recorder)
    return await role._build(core, stack, supervisor=supervisor, peers=peers)


__all__ = [
    "AgentWorkerServices",
    "ApiPeers",
    "ApiServices",
    "ChannelHubServices",
    "Core",
    "EventBusServices",
    "InstanceServices",
    "MetricsHub",
    "SchedulerServices",
    "WorkflowRunner",
    "WorkflowShardServices",
    "build_services",
]
