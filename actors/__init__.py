"""Ray actors that host the domain services (named, in the `orchestrator` namespace)."""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

NAMESPACE = "orchestrator"


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
    """Caller side of k sharded detached actors (`<prefix>-<i>`, each built with
    `(settings, i, k)`): handles created on first use and forgotten when one fails."""

    def __init__(
        self, settings: Any, actor_class: Any, prefix: str, shards: int, num_cpus: float
    ) -> None:
        self._settings = settings
        self._class = actor_class
        self._prefix = prefix
        self._shards = max(1, shards)
        self._cpus = num_cpus
        self._actors: dict[int, Any] = {}

    def actor(self, index: int) -> Any:
        actor = self._actors.get(index)
        if actor is None:
            actor = detached(
                self._class,
                f"{self._prefix}-{index}",
                self._cpus,
                self._settings,
                index,
                self._shards,
            )
            self._actors[index] = actor
        return actor

    def forget(self, index: int) -> None:
        """Look the actor up again next time (it was restarting, or killed for good)."""
        self._actors.pop(index, None)

    def ensure_started(self) -> None:
        """Every shard exists (and so resumes whatever it owns)."""
        for index in range(self._shards):
            self.actor(index).ready.remote()


def detached(actor_class: Any, name: str, num_cpus: float, *args: Any) -> Any:
    """The named, detached actor `name` in our namespace: the running one, else a new one
    built with `args` (replicas and other actors share it; it outlives them)."""
    return actor_class.options(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=num_cpus,
    ).remote(*args)
