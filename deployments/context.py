"""What an API replica's services are built with beyond its settings: the service's version and
the in-process metrics hub. The services themselves are built by the composition root,
`orchestrator.services.build_services` (role `ApiServices`)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from orchestrator.observability import MetricsSnapshot, MetricsState, SloQuery
from orchestrator.services import MetricsHub, WorkflowRunner

try:
    SERVICE_VERSION = version("orchestrator")
except PackageNotFoundError:  # running from a source tree that was not installed
    SERVICE_VERSION = "0.0.0+source"


class LocalMetricsHub:
    """In-process aggregation, for an app served without Ray (tests, plain uvicorn)."""

    def __init__(self) -> None:
        self.state = MetricsState()

    async def push(self, snapshot: MetricsSnapshot) -> None:
        self.state.apply(snapshot)

    async def render(self, event_totals: dict[str, int] | None = None) -> bytes:
        return self.state.render(event_totals)

    async def slo(self, query: SloQuery) -> dict[str, Any]:
        return self.state.slo(query.targets, query.uptime_ratio)

    async def gauges(self) -> dict[str, int]:
        return {
            "stream_sockets": self.state.stream_sockets(),
            "active_workers": self.state.active_workers(),
        }


__all__ = ["SERVICE_VERSION", "LocalMetricsHub", "MetricsHub", "WorkflowRunner"]
