"""The client class: every method of the API, one mixin per part of the API (each module
beside this one) over the core that sends requests (_core.py)."""

from __future__ import annotations

from orchestrator.sdk._async._inference import AsyncInference
from orchestrator.sdk._async._operations import AsyncOperations
from orchestrator.sdk._async._resources import AsyncResources
from orchestrator.sdk._async._tools import AsyncTools
from orchestrator.sdk._async._workflows import AsyncWorkflows

__all__ = ["AsyncClient"]


class AsyncClient(AsyncOperations, AsyncWorkflows, AsyncInference, AsyncResources, AsyncTools):
    """Client of the whole API (docs/sdk.md). `AsyncClient` has the methods as coroutines and
    is closed with `aclose()` or `async with`; `Client` (generated from it) has the same
    methods, blocking, and is closed with `close()` or `with`.

    `base_url` (with or without `/api/v1`) defaults to $ORCH_BASE_URL, then
    http://127.0.0.1:8000; `api_key` (a bearer token; `token=` is the same) to $ORCH_API_KEY.
    429, 503 and connection failures are retried `max_retries` times (RetryPolicy). Pass
    `http_client` (an httpx.AsyncClient here, an httpx.Client for `Client`) to send over
    your own: it is used as given and not closed by the client.
    """
