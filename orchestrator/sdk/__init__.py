"""Python client of the orchestration service's whole HTTP API (docs/sdk.md).

    from orchestrator.sdk import Client

    with Client() as api:  # ORCH_BASE_URL and ORCH_API_KEY, or Client(url, api_key=...)
        print(api.whoami().user_uuid)
        for wf in api.iter_workflows(status="completed"):
            print(wf.id, wf.name)

`AsyncClient` has the same methods, as coroutines. Errors answered by the service raise
`ApiError`; a degraded `/health` (503) is returned as a `Health` whose `.status` says so.
429, 503 and connection failures are retried (`max_retries`, Retry-After honoured).
"""

from orchestrator import wire
from orchestrator.sdk._async.client import AsyncClient
from orchestrator.sdk._base import API_PREFIX, ApiError, RetryPolicy, normalise_base_url
from orchestrator.sdk._requests import ScheduleOptions, StepRetry, StepSpec
from orchestrator.sdk._sync.client import Client
from orchestrator.wire import *  # noqa: F403  (the results: every wire model)

__all__ = [
    "API_PREFIX",
    "ApiError",
    "AsyncClient",
    "Client",
    "RetryPolicy",
    "ScheduleOptions",
    "StepRetry",
    "StepSpec",
    "normalise_base_url",
]
__all__ += wire.__all__
