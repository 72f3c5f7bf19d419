"""GET /health and GET /slo (SPEC part 4, operations)."""

from __future__ import annotations

from orchestrator.wire._base import ApiModel

__all__ = [
    "ComponentHealth",
    "Health",
    "HealthComponents",
    "MessagingHealth",
    "ProvidersHealth",
    "Slo",
    "SloEntry",
    "StoreHealth",
    "WorkersHealth",
]


class ComponentHealth(ApiModel):
    status: str


class StoreHealth(ComponentHealth):
    tables: int


class MessagingHealth(ComponentHealth):
    sockets: int


class ProvidersHealth(ApiModel):
    total: int
    healthy: int


class WorkersHealth(ApiModel):
    active: int
    idle: int


class HealthComponents(ApiModel):
    store: StoreHealth
    messaging: MessagingHealth
    providers: ProvidersHealth
    workers: WorkersHealth


class Health(ApiModel):
    """GET /health. A degraded service answers 503 with this same body."""

    status: str
    version: str
    uptime_seconds: float
    components: HealthComponents

    @property
    def healthy(self) -> bool:
        return self.status == "ok"


class SloEntry(ApiModel):
    target: float
    current: float
    compliant: bool


class Slo(ApiModel):
    latency_p99: SloEntry
    uptime_7d: SloEntry
    error_rate: SloEntry

    @property
    def compliant(self) -> bool:
        return self.latency_p99.compliant and self.uptime_7d.compliant and self.error_rate.compliant
