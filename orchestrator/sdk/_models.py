"""Typed results of the API, as a client sees them.

They mirror the response bodies of SPEC part 4 (operations) and the token endpoints of
DESIGN "Tokens". Unknown fields are kept rather than refused, so a newer server that adds a
field does not break an older client.
"""

from __future__ import annotations

from typing import Any

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
    "TemplateSaved",
    "TokenCreated",
    "TokenRevoked",
    "WhoAmI",
    "WorkersHealth",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowCreated",
    "WorkflowDeleted",
    "WorkflowPage",
    "WorkflowStep",
    "WorkflowSummary",
    "WorkflowTemplate",
    "WorkflowTemplates",
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


class WorkflowCreated(ApiModel):
    ok: bool = True
    id: str
    status: str


class WorkflowStep(ApiModel):
    name: str
    status: str
    result: str | None = None
    error: str | None = None


class Workflow(ApiModel):
    id: str
    name: str
    status: str
    steps: list[WorkflowStep]
    parent_id: str | None = None
    children: list[str] = []
    created_at: int
    updated_at: int
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


class WorkflowSummary(ApiModel):
    id: str
    name: str
    status: str
    created_at: int
    updated_at: int
    parent_id: str | None = None


class WorkflowPage(ApiModel):
    ok: bool = True
    data: list[WorkflowSummary]
    total: int
    limit: int
    offset: int


class WorkflowCancelled(ApiModel):
    ok: bool = True
    id: str
    status: str


class WorkflowDeleted(ApiModel):
    ok: bool = True
    id: str


class TemplateSaved(ApiModel):
    ok: bool = True
    name: str


class WorkflowTemplate(ApiModel):
    name: str
    steps: list[dict[str, Any]]
    variables: list[str]
    shared: bool
    owner: str | None = None
    created_at: int


class WorkflowTemplates(ApiModel):
    ok: bool = True
    data: list[WorkflowTemplate]


class JobCreated(ApiModel):
    status: str
    id: int
    next_run: int | None = None


class Job(ApiModel):
    """A scheduled job; the list's items carry the summary fields only (the rest None)."""

    id: int
    name: str
    schedule_type: str
    enabled: bool
    next_run: int | None = None
    last_run: int | None = None
    consecutive_errors: int = 0
    created_at: int
    cron_expr: str | None = None
    interval_ms: int | None = None
    prompt: str | None = None
    model: str | None = None
    last_result: str | None = None
    last_error: str | None = None
    user_uuid: str | None = None
    running: bool | None = None


class JobPage(ApiModel):
    items: list[Job]
    total: int
    page: int
    per_page: int


class JobStatus(ApiModel):
    status: str
    id: int
    next_run: int | None = None
