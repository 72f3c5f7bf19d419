"""ActorHost, the base of every process of a generation, outside Ray (it is a plain class;
`@ray.remote` wraps its subclasses): its boot is retried under its one supervisor, each
failed try's resources closed, and its restarts counted by its recorder."""

from __future__ import annotations

import asyncio
import contextlib

from actors.host import ActorHost
from orchestrator.config import Settings
from orchestrator.runtime.backoff import Backoff


class _Resource:
    def __init__(self, name: str, closed: list[str]) -> None:
        self.name = name
        self._closed = closed

    async def aclose(self) -> None:
        self._closed.append(self.name)


class _Probe(ActorHost):
    """Its start opens two resources and fails on its first try, after opening them."""

    def __init__(self) -> None:
        super().__init__("probe", Settings(), None)
        self._supervisor.backoff = Backoff(base=0.01, cap=0.01)
        self.tries = 0
        self.closed: list[str] = []
        self.booted = self._boot(self._start)

    async def _start(self, opened: contextlib.AsyncExitStack) -> str:
        self.tries += 1
        for name in ("pool", "client"):
            opened.push_async_callback(_Resource(f"{name}-{self.tries}", self.closed).aclose)
        if self.tries == 1:
            raise OSError("Postgres restarting")
        return f"started on try {self.tries}"


async def test_a_failed_boot_is_undone_and_tried_again_under_the_supervisor() -> None:
    probe = _Probe()
    try:
        assert await asyncio.wait_for(probe.booted, 5) == "started on try 2"
        # The failed try's resources closed, in reverse; the good try's kept.
        assert probe.closed == ["client-1", "pool-1"]
        assert probe._supervisor.restarts() == {"boot": 1}
        assert probe._recorder.drain().background_restarts == {"boot": 1}
        assert "boot" not in probe._supervisor.tasks()  # done
    finally:
        await probe._supervisor.aclose()


async def test_watch_answers_only_when_the_actor_ends() -> None:
    probe = _Probe()
    try:
        watching = asyncio.ensure_future(probe.watch())
        await asyncio.sleep(0.05)
        assert not watching.done()
        watching.cancel()
    finally:
        await probe._supervisor.aclose()
