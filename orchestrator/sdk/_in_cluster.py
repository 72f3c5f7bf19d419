"""The in-cluster SDK by its older names: `in_cluster_client(...)` is
`Client.in_cluster(...)`, `in_cluster_async_client(...)` is `AsyncClient.in_cluster(...)`,
and the transport and the handle's envelope are re-exported from where they live
(_serve_transport.py, orchestrator/wire/handle.py). The clients do not import this module,
so it imports them without a circle."""

from __future__ import annotations

from typing import Any

from orchestrator.sdk._async.client import AsyncClient
from orchestrator.sdk._serve_transport import (
    HANDLE_BASE_URL,
    AsyncServeTransport,
    ServeTransport,
    serve_handle,
)
from orchestrator.sdk._sync.client import Client
from orchestrator.wire.handle import HandleRequest, HandleResponse

__all__ = [
    "HANDLE_BASE_URL",
    "AsyncServeTransport",
    "HandleRequest",
    "HandleResponse",
    "ServeTransport",
    "in_cluster_async_client",
    "in_cluster_client",
    "serve_handle",
]


def in_cluster_client(
    token: str | None = None,
    *,
    app_name: str = "orchestrator",
    handle: Any = None,
    timeout: float = 30.0,
    max_retries: int = 2,
) -> Client:
    """`Client.in_cluster`."""
    return Client.in_cluster(
        token, app_name=app_name, handle=handle, timeout=timeout, max_retries=max_retries
    )


def in_cluster_async_client(
    token: str | None = None,
    *,
    app_name: str = "orchestrator",
    handle: Any = None,
    timeout: float = 30.0,
    max_retries: int = 2,
) -> AsyncClient:
    """`AsyncClient.in_cluster`."""
    return AsyncClient.in_cluster(
        token, app_name=app_name, handle=handle, timeout=timeout, max_retries=max_retries
    )
