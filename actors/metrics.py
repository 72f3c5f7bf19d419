"""The cluster-wide Metrics actor: every replica and actor pushes its deltas here each second,
and /metrics and /slo read the sums from it (one actor call per scrape, none per request)."""

from __future__ import annotations

from typing import Any

import ray

from actors import Generation, Watched, lookup
from orchestrator.observability import MetricsSnapshot, MetricsState, SloQuery

KIND = "Metrics"
# A source silent this long no longer contributes gauges (a replica that went away).
STALE_SOURCE_S = 30.0


# `watch` (Watched) makes this an async actor: its plain methods run on its event loop, one
# at a time, as they ran on its one thread before.
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class Metrics(Watched):
    def __init__(self, window_s: float = 300.0) -> None:
        self._state = MetricsState(window_s=window_s)
        self._pushes = 0

    def __repr__(self) -> str:
        state = self._state
        return (
            f"Metrics(pushes={self._pushes}, workers={state.active_workers()}, "
            f"sockets={state.stream_sockets()})"
        )

    def push(self, snapshot: MetricsSnapshot) -> None:
        self._pushes += 1
        self._state.apply(snapshot)

    def render(self, event_totals: dict[str, int] | None = None) -> bytes:
        self._state.forget_stale_sources(STALE_SOURCE_S)
        return self._state.render(event_totals)

    def slo(self, query: SloQuery) -> dict[str, Any]:
        return self._state.slo(query.targets, query.uptime_ratio)

    def gauges(self) -> dict[str, int]:
        self._state.forget_stale_sources(STALE_SOURCE_S)
        return {
            "stream_sockets": self._state.stream_sockets(),
            "active_workers": self._state.active_workers(),
        }


def metrics_actor(generation: Generation) -> Any:
    """The generation's Metrics actor (ActorUnavailableError while it is not running)."""
    return lookup(generation.name(KIND))


class ActorMetricsHub:
    """The `MetricsHub` of a replica or actor running under Ray: the Metrics actor of its
    generation, looked up on first use (until found: it may still be starting)."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self._handle: Any = None

    @property
    def _actor(self) -> Any:
        if self._handle is None:
            self._handle = metrics_actor(self._generation)
        return self._handle  # Ray restarts a crashed Metrics actor under the same handle

    async def push(self, snapshot: MetricsSnapshot) -> None:
        await self._actor.push.remote(snapshot)

    async def render(self, event_totals: dict[str, int] | None = None) -> bytes:
        return await self._actor.render.remote(event_totals)  # type: ignore[no-any-return]

    async def slo(self, query: SloQuery) -> dict[str, Any]:
        return await self._actor.slo.remote(query)  # type: ignore[no-any-return]

    async def gauges(self) -> dict[str, int]:
        return await self._actor.gauges.remote()  # type: ignore[no-any-return]
