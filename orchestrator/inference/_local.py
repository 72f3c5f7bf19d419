"""Where instance processes run. The HTTP layer sees only `LocalInference`; under Ray it is
`actors.inference.RayLocalInference` (one `InferenceInstance` actor per instance, placed on
a node with the GPUs it asks for), and `InProcessInference` runs the same runners as
tasks of the current process (one process, no Ray: tests, a single uvicorn worker)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from orchestrator.config import Settings
from orchestrator.db import Database, connect
from orchestrator.errors import ServiceUnavailable
from orchestrator.events import EventStore
from orchestrator.inference._instances import InstanceStore
from orchestrator.inference._runner import InstanceRunner

__all__ = ["InProcessInference", "LaunchFailed", "LocalInference"]


class LaunchFailed(ServiceUnavailable):
    """No process could be set up for the instance (e.g. no node has the GPUs it needs)."""


class LocalInference(Protocol):
    async def start(self, instance_id: str) -> None:
        """Launch the process of an instance recorded as starting. Returns once its host is
        running it (not once it is healthy); raises LaunchFailed when it cannot."""

    async def stop(self, instance_id: str, reason: str) -> bool:
        """Stop its process and record it stopped. False when nothing hosts it (the caller
        records the stop)."""

    async def stop_all(self, instance_ids: Sequence[str], reason: str) -> list[bool]:
        """`stop` for each, concurrently."""

    async def close(self) -> None:
        """The app is shutting down (instances hosted elsewhere keep running)."""


class InProcessInference:
    """Instance runners as tasks of this process; they end with it."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1") -> None:
        self._settings = settings
        self._host = host
        self._db: Database | None = None
        self._lock = asyncio.Lock()
        self._runners: dict[str, InstanceRunner] = {}

    async def _store(self) -> InstanceStore:
        async with self._lock:
            if self._db is None:
                if not self._settings.database_url:
                    raise LaunchFailed("local inference needs database_url")
                self._db = await connect(self._settings.database_url, min_size=1, max_size=4)
            return InstanceStore(EventStore(self._db.pool))

    def runner(self, instance_id: str) -> InstanceRunner | None:
        return self._runners.get(instance_id)

    async def start(self, instance_id: str) -> None:
        runner = InstanceRunner(await self._store(), instance_id, self._settings, self._host)
        self._runners[instance_id] = runner
        runner.start()

    async def stop(self, instance_id: str, reason: str) -> bool:
        runner = self._runners.pop(instance_id, None)
        if runner is None:
            return False
        await runner.stop(reason)
        return True

    async def stop_all(self, instance_ids: Sequence[str], reason: str) -> list[bool]:
        return list(await asyncio.gather(*(self.stop(i, reason) for i in instance_ids)))

    async def close(self) -> None:
        # Their processes cannot outlive this one's runners: stop them for the record.
        await self.stop_all(list(self._runners), "service shutting down")
        if self._db is not None:
            await self._db.close()
            self._db = None
