"""`InferenceInstance`: one actor per local inference instance (`orch-<app>-InferenceInstance-
<id>`; not part of a generation: a redeploy keeps its loaded model serving), placed by Ray
on a node with the GPUs it asks for; it owns its llama-server process and nothing else
(requests go straight to the process's port). `RayLocalInference` is how the HTTP replicas
start and stop them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import ray
import ray.util
from ray.exceptions import GetTimeoutError, RayActorError

from actors import NAMESPACE, app_prefix
from actors.host import ActorHost
from orchestrator.config import Settings
from orchestrator.inference import (
    InstanceRunner,
    InstanceState,
    LaunchFailed,
)
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.services import InstanceServices, build_services

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
KIND = "InferenceInstance"


def instance_actor_name(app: str, instance_id: str) -> str:
    return f"{app_prefix(app)}{KIND}-{instance_id}"


@ray.remote(  # type: ignore[call-overload]
    max_restarts=-1, max_task_retries=0, max_concurrency=100
)
class InferenceInstance(ActorHost):
    """Restarted by Ray when its process dies: the new incarnation reads the instance's
    record and respawns the server, unless the record says stopped or failed."""

    def __init__(self, settings: Settings, instance_id: str) -> None:
        # No generation: an instance outlives them (its metrics are the server's own).
        super().__init__(f"instance-{instance_id}", settings, None)
        self._id = instance_id
        self._host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        # What the services opened: kept as long as the process (Ray restarts the actor).
        self._opened = contextlib.AsyncExitStack()
        self._instance: InstanceRunner | None = None
        self._booted = asyncio.Event()
        self._stopping = False
        # Async actors run __init__ on their event loop: the supervision starts now, also
        # after a restart (nobody calls a method on a restarted actor to wake it up). Not
        # restarted by our supervisor: on failure Ray restarts the whole actor (below).
        self._main = self._supervisor.spawn("instance", self._run, restart=False)

    def __repr__(self) -> str:
        inner = self._instance.describe() if self._instance else f"id={self._id}, booting"
        return f"InferenceInstance({inner})"

    async def _run(self) -> None:
        try:
            try:
                services = await build_services(
                    self._settings, InstanceServices, self._opened, recorder=self._recorder
                )
                self._instance = InstanceRunner(
                    services.instances, self._id, self._settings, self._host
                )
            finally:
                self._booted.set()
            record = await self._instance.start()
        except Exception:  # the database is away, or went away in the middle of a transition
            # Unsure what the server and the record look like now: let Ray restart this
            # actor, whose next incarnation kills the server and starts from the record.
            log.exception("%s: supervision failed; restarting the actor", self._id)
            ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
            return
        if self._stopping:
            return
        state = record.state if record is not None else None
        log.info("%s ended in state %s: the actor exits", self._id, state)
        if state in (None, InstanceState.FAILED, InstanceState.STOPPED):
            # Nothing left to supervise: give back the GPU and do not come back.
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def ready(self) -> str:
        """Answers once the actor is placed and running (its __init__ is done)."""
        return repr(self)

    async def stop(self, reason: str) -> str | None:
        """Stop the server and record the instance stopped; its final state."""
        self._stopping = True
        await self._booted.wait()
        if self._instance is None:
            return None
        record = await self._instance.stop(reason)
        await cancel_and_wait([self._main])
        return str(record.state) if record is not None else None


def _num_gpus(settings: Settings) -> float:
    if settings.inference_gpus_per_instance is not None:
        return settings.inference_gpus_per_instance
    gpus = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call]
    return 1.0 if gpus > 0 else 0.0


class RayLocalInference:
    """`LocalInference` under Ray: instances are detached named actors, so any replica can
    stop an instance another one started, and instances outlive replicas and generations; the
    application's deletion stops them (actors/generation.py `sweep`)."""

    def __init__(self, settings: Settings, app: str) -> None:
        self._settings = settings
        self._app = app

    async def start(self, instance_id: str) -> None:
        gpus = _num_gpus(self._settings)
        actor: Any = InferenceInstance.options(  # type: ignore[attr-defined]
            name=instance_actor_name(self._app, instance_id),
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=self._settings.inference_actor_cpus,
            num_gpus=gpus,
        ).remote(self._settings, instance_id)
        timeout = self._settings.inference_schedule_timeout_s
        try:
            await asyncio.wait_for(actor.ready.remote(), timeout)
        except (TimeoutError, GetTimeoutError, RayActorError) as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            why = (
                f"no Ray node could host it (num_gpus={gpus:g}) within {timeout:g}s"
                if not isinstance(exc, RayActorError)
                else f"its actor died: {exc}"
            )
            raise LaunchFailed(f"cannot start instance {instance_id}: {why}") from exc

    async def stop(self, instance_id: str, reason: str) -> bool:
        try:
            actor = ray.get_actor(instance_actor_name(self._app, instance_id), namespace=NAMESPACE)
        except ValueError:  # never started, or ended (failed) and gone
            return False
        try:
            await asyncio.wait_for(actor.stop.remote(reason), STOP_TIMEOUT_S)
            return True
        except (TimeoutError, RayActorError) as exc:
            log.warning("stopping %s: %r; killing its actor", instance_id, exc)
            return False
        finally:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    async def stop_all(self, instance_ids: Sequence[str], reason: str) -> list[bool]:
        return list(await asyncio.gather(*(self.stop(i, reason) for i in instance_ids)))

    async def close(self) -> None:
        """Instances are detached: they keep serving while replicas and generations change."""
