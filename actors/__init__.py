"""Ray actors that host the domain services: named, in the `orchestrator` namespace, one
generation per application version (see actors/generation.py for who creates them)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import ray
from pydantic import BaseModel
from ray.exceptions import ActorUnavailableError

from actors.version import app_version, code_version

__all__ = [
    "NAMESPACE",
    "Generation",
    "Shards",
    "Watched",
    "app_prefix",
    "app_version",
    "code_version",
    "lookup",
]

NAMESPACE = "orchestrator"


def app_prefix(app: str) -> str:
    """What every actor name of application `app` starts with (all generations)."""
    return f"orch-{app}-"


@dataclass(frozen=True)
class Generation:
    """The actors of one application version: `orch-<app>-<version8>-<Kind>[-<i>]`. Replicas
    and actors of a version reach each other by these names; a redeploy with other code or
    other settings the actors read (actors/version.py) is another version, so another set
    of names (the old set is drained, killed)."""

    app: str
    version: str

    @classmethod
    def of(cls, app: str, settings: BaseModel) -> Generation:
        return cls(app, app_version(settings))

    @classmethod
    def of_actor_name(cls, name: str) -> Generation:
        """The generation an actor name belongs to (its version: the 8 digits the name has)."""
        found = re.match(r"orch-(.+)-([0-9a-f]{8})-[A-Za-z]", name)
        if found is None:
            raise ValueError(f"{name!r} is not the name of a generation's actor")
        return cls(found.group(1), found.group(2))

    @property
    def prefix(self) -> str:
        return f"{app_prefix(self.app)}{self.version[:8]}-"

    def name(self, kind: str, index: int | None = None) -> str:
        return f"{self.prefix}{kind}" + ("" if index is None else f"-{index}")


def lookup(name: str) -> Any:
    """The running actor `name` in our namespace. Missing (its generation still starting, or
    already drained) is an ActorUnavailableError, a RayActorError: callers already handle
    those by looking again later."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as exc:
        raise ActorUnavailableError(f"actor {name} is not running", None) from exc


class Watched:
    """An actor whose death its owner awaits rather than polls for (actors/generation.py
    `keep`)."""

    async def watch(self) -> None:
        """Never answers while this actor lives: the call fails (RayActorError at the
        caller) when the actor dies, whether Ray restarts it or not."""
        await asyncio.Event().wait()


class Shards:
    """Caller side of the k sharded actors `<generation>-<kind>-<i>` (the generation creates
    them): handles looked up on first use and forgotten when one fails."""

    def __init__(self, generation: Generation, kind: str, shards: int) -> None:
        self._generation = generation
        self._kind = kind
        self._shards = max(1, shards)
        self._actors: dict[int, Any] = {}

    def actor(self, index: int) -> Any:
        actor = self._actors.get(index)
        if actor is None:
            actor = lookup(self._generation.name(self._kind, index))
            self._actors[index] = actor
        return actor

    def forget(self, index: int) -> None:
        """Look the actor up again next time (it was restarting, or killed for good)."""
        self._actors.pop(index, None)
