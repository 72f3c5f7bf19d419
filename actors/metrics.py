"""The cluster-wide Metrics actor: every replica and actor pushes its deltas here each second,
and /metrics and /slo read the sums from it (one actor call per scrape, none per request)."""

from __future__ import annotations

from typing import Any

import ray

from actors import NAMESPACE
from orchestrator.observability import MetricsSnapshot, MetricsState, SloQuery

ACTOR_NAME = "metrics"
# A source silent this long no longer contributes gauges (a replica that went away).
STALE_SOURCE_S = 30.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class Metrics:
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


def get_or_create_metrics(window_s: float) -> Any:
    return Metrics.options(  # type: ignore[attr-defined]
        name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(window_s)


class ActorMetricsHub:
    """The `MetricsHub` of a replica running under Ray."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def push(self, snapshot: MetricsSnapshot) -> None:
        await self._actor.push.remote(snapshot)

    async def render(self, event_totals: dict[str, int] | None = None) -> bytes:
        return await self._actor.render.remote(event_totals)  # type: ignore[no-any-return]

    async def slo(self, query: SloQuery) -> dict[str, Any]:
        return await self._actor.slo.remote(query)  # type: ignore[no-any-return]

    async def gauges(self) -> dict[str, int]:
        return await self._actor.gauges.remote()  # type: ignore[no-any-return]
