"""`Core`, what every process's services have, and `build_services`, the one builder."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from orchestrator.config import Settings
from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.observability import MetricsRecorder

if TYPE_CHECKING:
    from orchestrator.runtime.supervisor import Supervisor
    from orchestrator.services._api import ApiPeers

S = TypeVar("S", bound="Core")


@dataclass(frozen=True)
class Core:
    """What every process has. `POOL`: the role's Postgres connections (min, max)."""

    POOL: ClassVar[tuple[int, int]] = (1, 4)

    settings: Settings
    db: Database
    events: EventStore
    recorder: MetricsRecorder

    @classmethod
    def _pool(cls, settings: Settings) -> tuple[int, int]:
        return cls.POOL

    @classmethod
    async def _build(cls: type[S], core: Core, stack: contextlib.AsyncExitStack, **_: Any) -> S:
        return cls(**_fields(core))


def _fields(core: Core) -> dict[str, Any]:
    # Not dataclasses.asdict: that deep-copies the pool.
    return {f.name: getattr(core, f.name) for f in fields(Core)}


async def build_services(
    settings: Settings,
    role: type[S],
    stack: contextlib.AsyncExitStack,
    *,
    recorder: MetricsRecorder,
    supervisor: Supervisor | None = None,
    peers: ApiPeers | None = None,
    **extra: Any,
) -> S:
    """The services of a process of kind `role` (a `Core` subclass, one per kind of process),
    built completely; what they open is closed by `stack`, also when this fails halfway.
    `recorder`: the process's metrics recorder (an actor's is its host's);
    `supervisor` and `peers`: the API replica's (its loops and what Ray serves it); an
    actor's supervisor where its services run loops of their own (an agent worker's memory
    cache); `extra`: what the role's build takes besides (an agent worker's `dispatch`)."""
    if not settings.database_url:
        raise RuntimeError("database_url must be set before the service starts")
    low, high = role._pool(settings)
    db = await connect(settings.database_url, min_size=low, max_size=high)
    stack.push_async_callback(db.close)
    core = Core(settings=settings, db=db, events=EventStore(db.pool), recorder=recorder)
    return await role._build(core, stack, supervisor=supervisor, peers=peers, **extra)
