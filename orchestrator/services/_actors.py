"""The actors' roles: each opens only what its actor uses (heavy modules imported inside its
build, in the actor's own process)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.services._core import Core, _fields

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import httpx

    from orchestrator.agents import AgentRunner, AgentTask, TaskResult
    from orchestrator.channels import ChannelStore
    from orchestrator.inference import InstanceStore
    from orchestrator.interventions import InterventionStore
    from orchestrator.memory import MemoryStore
    from orchestrator.providers import Gateway
    from orchestrator.runtime.supervisor import Supervisor
    from orchestrator.scheduler import JobStore
    from orchestrator.toolset import AgentToolClients
    from orchestrator.workflows import WorkflowStore


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
    interventions: InterventionStore  # expired by the engine's sweep (issue 32)

    @classmethod
    async def _build(
        cls, core: Core, stack: contextlib.AsyncExitStack, **_: Any
    ) -> WorkflowShardServices:
        from orchestrator.interventions import InterventionStore
        from orchestrator.workflows import WorkflowStore

        return cls(
            **_fields(core),
            workflows=WorkflowStore(core.db.pool, core.events),
            interventions=InterventionStore(
                core.db.pool,
                core.events,
                default_timeout_s=core.settings.intervention_timeout_s,
            ),
        )


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
    interventions: InterventionStore  # where a task step parks a call under `ask` (issue 32)

    @classmethod
    async def _build(
        cls,
        core: Core,
        stack: contextlib.AsyncExitStack,
        supervisor: Supervisor | None = None,
        dispatch: Callable[[AgentTask], Awaitable[TaskResult]] | None = None,
        **_: Any,
    ) -> AgentWorkerServices:
        """`dispatch`: how this worker sends a team member's task to the pool (issue 33;
        without it, coordinators here get no team tools)."""
        import redis.asyncio as aioredis

        from orchestrator.agents import AgentRunner
        from orchestrator.inference import ready_endpoints
        from orchestrator.interventions import InterventionStore
        from orchestrator.marketplace import Marketplace
        from orchestrator.memory import MemoryStore
        from orchestrator.providers import Gateway
        from orchestrator.secret_box import configured_box
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
            supervisor=supervisor,
            key_scope=s.memory_key_scope,
        )
        # Before Redis closes (the stack runs last-in first): the DELs it still owes.
        stack.push_async_callback(memory.settle)
        tool_clients = AgentToolClients(s)
        stack.push_async_callback(tool_clients.aclose)
        interventions = InterventionStore(pool, events, default_timeout_s=s.intervention_timeout_s)
        tools: dict[str, Any] = {}
        if dispatch is not None:
            from orchestrator.teams import MailWaker, TeamHub, TeamStore

            waker = MailWaker(s.database_url, s.team_receive_poll_s)
            stack.push_async_callback(waker.close)
            tools["teams"] = TeamHub(TeamStore(pool, events), s, dispatch, waker)
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
                **tools,
            },
            interventions=interventions,
            box=configured_box(s),
        )
        return cls(
            **_fields(core),
            gateway=gateway,
            memory=memory,
            tool_clients=tool_clients,
            runner=runner,
            interventions=interventions,
        )
