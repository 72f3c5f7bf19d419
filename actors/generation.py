"""One generation of the application's actors: every Metrics, EventBus, AgentWorker,
WorkflowShard, Scheduler and ChannelHub actor of one application version, named
`orch-<app>-<version8>-<Kind>[-<i>]` in our namespace.

The application's `Runtime` deployment (deployments/runtime.py) creates them, owns them and
keeps them (`keep`: it learns of a member's death from the member's `watch` call failing,
without listing Ray's actors): they are not detached, so Ray kills them when that replica's
process ends, however it ends.
When Serve stops the replica (a redeploy with another version, or the application's
deletion) the generation is drained first: nothing new starts, the work in flight ends or
stays claimed in Postgres for the next generation, then every actor is killed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.util
from ray.exceptions import RayActorError

from actors import NAMESPACE, Generation, app_prefix
from actors.agent_worker import KIND as WORKER
from actors.agent_worker import AgentWorker, worker_name
from actors.channel_hub import KIND as HUB
from actors.channel_hub import ChannelHub
from actors.event_bus import KIND as BUS
from actors.event_bus import EventBus
from actors.inference import KIND as INSTANCE
from actors.metrics import KIND as METRICS
from actors.metrics import Metrics
from actors.records import append_now
from actors.scheduler import KIND as SCHEDULER
from actors.scheduler import Scheduler
from actors.workflow_shard import KIND as SHARD
from actors.workflow_shard import WorkflowShard
from orchestrator.config import Settings
from orchestrator.events import NewEvent
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import HEALTHY_RUN_S, RESTART_BACKOFF

log = logging.getLogger(__name__)

# How long a new generation waits for a name its predecessor of the same version still holds
# (that predecessor's owner has died; Ray is killing its actors).
NAME_WAIT_S = 60.0


@dataclass(frozen=True)
class Member:
    """One actor of a generation: how to create it and which call starts its work."""

    kind: str
    name: str
    actor_class: Any
    args: tuple[Any, ...]
    options: dict[str, Any] = field(default_factory=dict)
    start: str = "ready"


def members(settings: Settings, generation: Generation) -> list[Member]:
    """Every actor of `generation`, in creation order: what others look up comes first."""
    g = generation
    shards, hubs = max(1, settings.workflow_shards), max(1, settings.channel_hubs)
    return [
        Member(METRICS, g.name(METRICS), Metrics, (settings.slo_window_s,), start="gauges"),
        Member(BUS, g.name(BUS), EventBus, (settings, g), start="head"),
        *(
            Member(
                WORKER,
                g.name(WORKER, i),
                AgentWorker,
                (settings, i, g),
                {
                    "num_cpus": settings.agent_worker_cpus,
                    "max_concurrency": settings.agent_worker_concurrency,
                },
            )
            for i in range(settings.agent_workers)
        ),
        *(
            Member(
                SHARD,
                g.name(SHARD, i),
                WorkflowShard,
                (settings, i, shards, g),
                {"num_cpus": settings.workflow_shard_cpus},
            )
            for i in range(shards)
        ),
        Member(SCHEDULER, g.name(SCHEDULER), Scheduler, (settings, g), start="status"),
        *(
            Member(
                HUB,
                g.name(HUB, i),
                ChannelHub,
                (settings, i, hubs, g),
                {"num_cpus": settings.channel_hub_cpus},
            )
            for i in range(hubs)
        ),
    ]


def _create(member: Member, starts: list[tuple[Member, Any]] | None = None) -> Any:
    # Not detached: owned by the calling process (the Runtime replica) and killed with it.
    handle = member.actor_class.options(
        name=member.name, namespace=NAMESPACE, **member.options
    ).remote(*member.args)
    start = getattr(handle, member.start).remote()  # start its work now, not at its first call
    if starts is not None:
        starts.append((member, start))
    return handle


def _name_taken(exc: ValueError) -> bool:
    return "already taken" in str(exc) or "already exists" in str(exc)


async def create(
    members_: Iterable[Member],
    wait_s: float = NAME_WAIT_S,
    started_within_s: float | None = None,
    database_url: str | None = None,
) -> dict[str, Any]:
    """Create every member; a name still held by a dying predecessor is waited for. With
    `started_within_s`, also wait (that long at most) for every member's start call; with
    `database_url` too, an AgentWorker whose start did not answer in time is recorded as
    worker.spawn_failed (the Runtime replica has no store: a connection of its own)."""
    handles: dict[str, Any] = {}
    starts: list[tuple[Member, Any]] = []
    deadline = time.monotonic() + wait_s
    for member in members_:
        while True:
            try:
                handles[member.name] = _create(member, starts)
                break
            except ValueError as exc:
                if not _name_taken(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    if started_within_s is not None:
        # A start that fails or takes longer is the actor's own business (it retries, Ray
        # restarts it, places it once a node can hold it, `keep` recreates it): noted, not
        # waited for.
        late = await _late(starts, started_within_s)
        failed = [_not_started(m, started_within_s) for m in late if m.kind == WORKER]
        if failed and database_url:
            await append_now(database_url, failed)
    return handles


async def _answer(ref: Any) -> Any:
    return await ref


async def _late(starts: list[tuple[Member, Any]], timeout_s: float) -> list[Member]:
    """The members whose start call has not answered within `timeout_s` (a failed one is
    logged: its actor retries or Ray restarts it)."""
    if not starts:
        return []
    calls = {asyncio.ensure_future(_answer(ref)): member for member, ref in starts}
    done, pending = await asyncio.wait(calls, timeout=max(0.1, timeout_s))
    for call in pending:
        call.cancel()  # the start goes on in the actor; only this wait ends
    for call in done:
        if call.exception() is not None:
            log.warning("starting %s: %r", calls[call].name, call.exception())
    late = [calls[call] for call in pending]
    if late:
        names = ", ".join(m.name for m in late)
        log.warning("starting the generation: %s not started within %.1fs", names, timeout_s)
    return late


def _not_started(member: Member, waited_s: float) -> NewEvent:
    """worker.spawn_failed of an AgentWorker whose start call did not answer in time: most
    often a placement no node can meet yet (Ray holds the actor and places it once one can;
    nothing of it ran), else a start that slow (it goes on)."""
    cpus = member.options.get("num_cpus")
    return NewEvent(
        "worker.spawn_failed",
        {
            "worker_id": worker_name(member.args[1]),  # an AgentWorker's args: settings, i, g
            "error": f"not started within {waited_s:g}s: Ray has not placed it (it asks for "
            f"{cpus} CPU; a placement no node can meet waits until one can) or its start is "
            "that slow",
            "attempt": 1,
        },
    )


def alive_names(prefix: str) -> set[str]:
    """Names of our namespace's live (or restarting) actors that start with `prefix`: a
    listing of every namespace's named actors (the replica calling it runs in Serve's), so
    only where nothing else tells (stopping an application), never on a timer."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return {
        n["name"]
        for n in names
        if isinstance(n, dict) and n.get("namespace") == NAMESPACE and n["name"].startswith(prefix)
    }


def _registered(name: str) -> bool:
    """Whether `name` is a live or restarting actor of our namespace (a blocking lookup)."""
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


async def keep(member: Member, handles: dict[str, Any], backoff: Backoff = RESTART_BACKOFF) -> None:
    """Keep `member` alive while this runs (the Runtime replica runs one per member under
    its supervisor). The member's `watch` call answers only when the actor dies: a crash Ray
    restarts under the same name and handle (the call is made again, and waits for it), or
    an end for good (`ray.kill`, past its restarts, a failed creation), after which the
    member is created again. Nothing is asked of Ray while the member lives; deaths in a row
    (a member that cannot start) are looked at less and less often."""
    deaths = 0
    while True:
        watched_at = time.monotonic()
        with contextlib.suppress(RayActorError):
            await handles[member.name].watch.remote()
        deaths = 1 if time.monotonic() - watched_at >= HEALTHY_RUN_S else deaths + 1
        await asyncio.sleep(backoff.delay(deaths))
        if await asyncio.to_thread(_registered, member.name):
            continue  # restarting (or restarted): the same handle reaches it
        try:
            handles[member.name] = _create(member)
        except ValueError as exc:  # it came back meanwhile
            if not _name_taken(exc):
                raise
            handles[member.name] = await asyncio.to_thread(
                ray.get_actor, member.name, namespace=NAMESPACE
            )
            continue
        log.warning("%s was gone; created it again", member.name)


async def _bounded(calls: list[Any], timeout_s: float, what: str) -> None:
    if not calls:
        return
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*calls, return_exceptions=True), max(0.1, timeout_s)
        )
    except TimeoutError:
        log.warning("%s did not finish within %.1fs", what, timeout_s)
        return
    for result in results:
        if isinstance(result, BaseException):
            log.warning("%s: %r", what, result)


async def drain(
    members_: Iterable[Member],
    handles: dict[str, Any],
    timeout_s: float,
    reason: str = "its generation is being replaced",
) -> None:
    """Drain the generation, then kill it. First nothing new starts: the scheduler stops
    dispatching and gives its lease up, shards and hubs stop driving (their workflows and
    inbox items stay in Postgres, for the next generation to claim). Then the agent tasks
    still running end (within what is left of `timeout_s`); each agent worker records
    worker.killed with `reason`. Then every actor is killed."""
    deadline = time.monotonic() + timeout_s
    by_kind: dict[str, list[Any]] = {}
    for member in members_:
        handle = handles.get(member.name)
        if handle is not None:
            by_kind.setdefault(member.kind, []).append(handle)
    consumers = [h for k in (SCHEDULER, SHARD, HUB) for h in by_kind.get(k, [])]
    await _bounded(
        [h.drain.remote() for h in consumers],
        deadline - time.monotonic(),
        "draining the scheduler, shards and hubs",
    )
    await _bounded(
        [h.drain.remote(reason) for h in by_kind.get(WORKER, [])],
        deadline - time.monotonic(),
        "draining the agent workers",
    )
    for handle in handles.values():
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


async def stop_instances(app: str, reason: str, timeout_s: float) -> None:
    """Stop the application's inference instances the way a user's stop does (the server
    ends, the record says stopped), within `timeout_s`; the sweep kills what remains."""
    prefix = f"{app_prefix(app)}{INSTANCE}-"

    def send() -> list[Any]:  # name lookups block: off the event loop
        calls: list[Any] = []
        for name in alive_names(prefix):
            with contextlib.suppress(ValueError, AttributeError):  # gone meanwhile; not one
                calls.append(ray.get_actor(name, namespace=NAMESPACE).stop.remote(reason))
        return calls

    await _bounded(await asyncio.to_thread(send), timeout_s, "stopping the inference instances")


def sweep(app: str) -> list[str]:
    """Kill every actor of application `app` still alive in our namespace (any generation,
    and the inference instances): what stopping the application leaves behind. Returns the
    names killed."""
    killed: list[str] = []
    for name in sorted(alive_names(app_prefix(app))):
        with contextlib.suppress(ValueError):  # gone meanwhile
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            killed.append(name)
    return killed


def wait_gone(app: str, timeout_s: float) -> set[str]:
    """Until no actor of `app` is alive (or the timeout); what is still alive."""
    deadline = time.monotonic() + timeout_s
    while alive := alive_names(app_prefix(app)):
        if time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
    return set()
