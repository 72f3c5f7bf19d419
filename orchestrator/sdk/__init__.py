"""Python client of the orchestration service's HTTP API.

    from orchestrator.sdk import Client

    with Client("http://127.0.0.1:8000", token=TOKEN) as api:
        print(api.whoami().user_uuid)

`AsyncClient` has the same methods, as coroutines. Errors answered by the service raise
`ApiError`; a degraded `/health` (503) is returned as a `Health` whose `.status` says so.
"""

from orchestrator.sdk._client import API_PREFIX, ApiError, AsyncClient, Client, normalise_base_url
from orchestrator.sdk._models import (
    ComponentHealth,
    Health,
    HealthComponents,
    Job,
    JobCreated,
    JobPage,
    JobStatus,
    MessagingHealth,
    ProvidersHealth,
    Slo,
    SloEntry,
    StoreHealth,
    TemplateSaved,
    TokenCreated,
    TokenRevoked,
    WhoAmI,
    WorkersHealth,
    Workflow,
    WorkflowCancelled,
    WorkflowCreated,
    WorkflowDeleted,
    WorkflowPage,
    WorkflowStep,
    WorkflowSummary,
    WorkflowTemplate,
    WorkflowTemplates,
)

__all__ = [
    "API_PREFIX",
    "ApiError",
    "AsyncClient",
    "Client",
    "ComponentHealth",
    "Health",
    "HealthComponents",
    "Job",
    "JobCreated",
    "JobPage",
    "JobStatus",
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
    "normalise_base_url",
]
