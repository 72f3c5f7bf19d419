"""Typed results of the API, as a client sees them.

They mirror the response bodies of SPEC part 4 (operations) and the token endpoints of
DESIGN "Tokens". Unknown fields are kept rather than refused, so a newer server that adds a
field does not break an older client.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ApiModel",
    "ComponentHealth",
    "Health",
    "HealthComponents",
    "MessagingHealth",
    "ProvidersHealth",
    "Slo",
    "SloEntry",
    "StoreHealth",
    "TokenCreated",
    "TokenRevoked",
    "WhoAmI",
    "WorkersHealth",
]


class ApiModel(BaseModel):
    """Base of every result: immutable, and tolerant of fields added by newer servers."""

    model_config = ConfigDict(extra="allow", frozen=True)


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


class WhoAmI(ApiModel):
    ok: bool = True
    user_uuid: str
    admin: bool


class TokenCreated(ApiModel):
    """A newly issued token. `token` is shown only here; `prefix` identifies it later."""

    ok: bool = True
    token: str
    prefix: str
    user_uuid: str
    admin: bool


class TokenRevoked(ApiModel):
    ok: bool = True
    revoked: int
