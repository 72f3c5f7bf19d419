"""The `Runtime` deployment: one replica per application version that owns its actor
generation (actors/generation.py).

Why a deployment of our own rather than actors made by `build_app` or Serve's deployment
actors: `build_app` runs in the driver or in Serve's build task, so what it creates is either
tied to that process or detached and owned by nobody. Serve's `deployment_actors` are killed
without a drain and never restarted by Ray (handles go stale until the controller's health
checks recreate them). A replica that creates them is stopped by Serve gracefully on a
redeploy and on `serve delete` (its `__del__` drains and kills the generation), and its
actors are not detached, so Ray kills them even when the replica dies some other way.

The replica is deployed under the generation's version (actors/version.py): a redeploy that
changes only what the HTTP replicas read (the log level, a rate limit) leaves it, and so
the generation, running. While it runs it keeps every member alive by awaiting each one's
`watch` call (actors/generation.py `keep`): a member killed for good is created again."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from ray import serve
from ray.serve._private.common import ReplicaState
from ray.serve.schema import ApplicationStatus

from actors import Generation
from actors.generation import Member, create, drain, keep, members, stop_instances, sweep
from actors.host import ActorHost
from deployments.logs import log_like_serve, serve_logging_config
from orchestrator.config import Settings
from orchestrator.observability import flush_buffered_logs

log = logging.getLogger(__name__)

# What an application's deletion gives its inference instances to stop.
INSTANCE_STOP_S = 10.0
# What Serve grants `__del__` beyond the drain itself (killing, inference instances).
SHUTDOWN_MARGIN_S = INSTANCE_STOP_S + 10.0
# How long a starting generation waits for the ingress to serve before it starts anyway.
INGRESS_FIRST_S = 20.0
INGRESS_POLL_S = 0.2
# How long the replica waits for its actors' start calls (the application is RUNNING after).
GENERATION_START_S = 60.0


def _ingress_running(app: str, ingress: str) -> bool:
    """Whether a replica of the application's ingress deployment serves (any version)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:  # noqa: BLE001 - unknown: do not hold the generation back
        log.warning("cannot read the status of %s (%r)", app, exc)
        return True
    deployment = status.deployments.get(ingress) if status is not None else None
    return deployment is not None and deployment.replica_states.get(ReplicaState.RUNNING, 0) > 0


async def _after_ingress(app: str, ingress: str, timeout_s: float = INGRESS_FIRST_S) -> None:
    """Until the ingress serves (or `timeout_s`). A start is CPU-bound: the generation's
    actors are nine processes importing Python, and started beside the ingress replicas
    they took the CPU those needed (a restart to /ready: 11 s with them, 8 s after them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_ingress_running, app, ingress):
            return
        await asyncio.sleep(INGRESS_POLL_S)
    log.warning("the ingress %s did not serve in %.0fs: starting the actors", ingress, timeout_s)


def _app_deleting(app: str) -> bool:
    """Whether Serve is deleting `app` (rather than replacing this version of it)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:  # noqa: BLE001 - unknown: keep what outlives generations
        log.warning("cannot read the status of %s (%r)", app, exc)
        return False
    return status is None or status.status == ApplicationStatus.DELETING


@serve.deployment(name="Runtime", num_replicas=1, max_ongoing_requests=16)
class Runtime(ActorHost):
    """Creates the generation when it starts, once the ingress serves, and keeps it; drains
    and kills it when Serve stops it. Its logs are Serve's (a replica), flushed every second
    with its metrics."""

    # Serve awaits an async constructor: the generation runs before the replica is ready
    # (so the application is RUNNING once its actors run), and it starts once the ingress
    # deployment `ingress` serves: the API answers first, the actors come up a second or two
    # later (a workflow created meanwhile waits in Postgres for its shard; docs/runtime.md).
    async def __init__(  # type: ignore[misc]
        self, settings: Settings, generation: Generation, ingress: str
    ) -> None:
        super().__init__("runtime", settings, generation)
        self._generation = generation
        self._members: list[Member] = members(settings, generation)
        self._handles: dict[str, Any] = {}
        log.info("generation %s: starting once %s serves", generation.prefix, ingress)
        flush_buffered_logs()  # Serve buffers a replica's lines until its constructor ends
        await _after_ingress(generation.app, ingress)
        self._handles.update(
            await create(
                self._members,
                started_within_s=GENERATION_START_S,
                database_url=settings.database_url,  # a worker not started: spawn_failed
            )
        )
        for member in self._members:
            self._supervisor.spawn(
                f"keep {member.name.removeprefix(generation.prefix)}",
                functools.partial(keep, member, self._handles),
            )
        log.info("generation %s: %d actors", generation.prefix, len(self._handles))

    def _configure_logs(self, settings: Settings) -> None:
        log_like_serve(settings)

    def _before_flush(self) -> None:
        flush_buffered_logs()  # Serve buffers this replica's log lines

    def __repr__(self) -> str:
        return f"Runtime({self._generation.prefix}, actors={len(self._handles)})"

    async def describe(self) -> dict[str, Any]:
        return {
            "app": self._generation.app,
            "version": self._generation.version,
            "actors": sorted(self._handles),
        }

    async def __del__(self) -> None:
        """Serve stops this replica: drain and kill the generation; when the application is
        being deleted, also stop its inference instances (they outlive redeploys)."""
        await self._supervisor.aclose()
        deleting = await asyncio.to_thread(_app_deleting, self._generation.app)
        # What the agent workers' worker.killed says.
        reason = "application deleted (shutdown)" if deleting else "replaced by a new version"
        await drain(self._members, self._handles, self._settings.generation_drain_s, reason)
        if deleting:
            app = self._generation.app
            await stop_instances(app, "application deleted", INSTANCE_STOP_S)
            killed = await asyncio.to_thread(sweep, app)
            log.info("application %s deleted: killed %s", self._generation.app, killed)
        log.info("generation %s drained and killed", self._generation.prefix)


def runtime_deployment(settings: Settings, generation: Generation) -> Any:
    """The Runtime deployment with Serve's stop budget covering the drain, under the
    generation's version."""
    return Runtime.options(  # type: ignore[attr-defined]
        # Serve stopped taking a deployment's version from users (each `serve.run` gets a
        # random one, so every redeploy replaced every replica, this one and so the whole
        # generation). Same version, same running replica: Serve does not restart it, and
        # its arguments cannot differ in anything the actors read. A config deployed with
        # `serve deploy` gets its version from Serve (its args), as before.
        version=generation.version,
        _internal=True,
        ray_actor_options={"num_cpus": 0},
        logging_config=serve_logging_config(settings),
        graceful_shutdown_timeout_s=settings.generation_drain_s + SHUTDOWN_MARGIN_S,
        # Stopped before its successor starts (Serve's default, said here because the
        # successor of the same version must find the names free).
        max_surge_percent=0,
    )
