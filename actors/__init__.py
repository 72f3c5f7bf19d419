"""Ray actors that host the domain services: named, in the `orchestrator` namespace, one
generation per application version (see actors/generation.py for who creates them)."""

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ray
from pydantic import BaseModel, SecretBytes, SecretStr
from ray.exceptions import ActorUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

NAMESPACE = "orchestrator"
# Packages whose code the actors run: a change in any of them is a new application version.
CODE_PACKAGES = ("orchestrator", "actors", "deployments")


def app_prefix(app: str) -> str:
    """What every actor name of application `app` starts with (all generations)."""
    return f"orch-{app}-"


@dataclass(frozen=True)
class Generation:
    """The actors of one application version: `orch-<app>-<version8>-<Kind>[-<i>]`. Replicas
    and actors of a version reach each other by these names; a redeploy with other code or
    settings is another version, so another set of names (the old set is drained, killed)."""

    app: str
    version: str

    @classmethod
    def of(cls, app: str, settings: BaseModel) -> "Generation":
        return cls(app, app_version(settings))

    @classmethod
    def of_actor_name(cls, name: str) -> "Generation":
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


@functools.cache
def code_version() -> str:
    """A digest of the source the actors run (Python and SQL of our packages)."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            root = Path(location)
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".sql") and path.is_file():
                    digest.update(str(path.relative_to(root.parent)).encode())
                    digest.update(path.read_bytes())
    return digest.hexdigest()


def _reveal(value: Any) -> Any:
    # Secrets count too (a new provider key must reach the workers); only their digest is kept.
    if isinstance(value, SecretStr | SecretBytes):
        return str(value.get_secret_value())
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def app_version(settings: BaseModel) -> str:
    """The application version: the code plus every setting (the actors get the whole
    Settings object, so any of them may change what they do)."""
    body = json.dumps(settings.model_dump(), default=_reveal, sort_keys=True)
    return hashlib.sha256(f"{code_version()}\n{body}".encode()).hexdigest()[:16]


def lookup(name: str) -> Any:
    """The running actor `name` in our namespace. Missing (its generation still starting, or
    already drained) is an ActorUnavailableError, a RayActorError: callers already handle
    those by looking again later."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as exc:
        raise ActorUnavailableError(f"actor {name} is not running", None) from exc


async def until_started(
    what: str, start: Callable[[], Awaitable[T]], cleanup: Callable[[], Awaitable[None]]
) -> T:
    """`start()` until it works, with backoff: an actor whose start failed once (Postgres
    restarting) must not stay broken for every call made to it afterwards. `cleanup()`
    undoes a half-done start before the next try."""
    delay = 0.5
    while True:
        try:
            return await start()
        except Exception as exc:  # noqa: BLE001 - any start failure is retried
            log.warning("%s: start failed (%r); retrying in %.1fs", what, exc, delay)
            with contextlib.suppress(Exception):
                await cleanup()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


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
