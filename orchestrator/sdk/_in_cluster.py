"""The API from a program on the Ray cluster, through the application's Serve deployment
handle instead of HTTP.

An httpx transport that sends each request, serialised as a `HandleRequest`, to the `Api`
deployment's `handle_request` method. That method runs it through the same FastAPI app a
replica serves HTTP with (deployments/in_cluster.py), middleware included, so the token in
`Authorization` is verified, rate limited and owns what it owns exactly as over HTTP: the
handle is a different wire, never a different set of rules. Answers come back as a stream:
a `HandleResponse` (status, headers, the body so far) then body chunks, so streaming routes
(`/sync-events`, streamed completions) work too.

Why a transport rather than a second client: every SDK method, present and future, works
in the cluster unchanged (`Client(http_client=httpx.Client(transport=ServeTransport(h)))`).

No Ray import here (the SDK must import without Ray): the caller passes the handle
(`serve.get_deployment_handle("Api", app_name=...)`), or `Client.in_cluster` looks it up
through `serve_handle`, which imports Ray only when called.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from orchestrator.sdk._async_client import AsyncClient
    from orchestrator.sdk._client import Client

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

# The base URL of clients on this transport: only its path counts (`/api/v1`); the host
# names the wire in logs and errors.
HANDLE_BASE_URL = "http://ray-handle/api/v1"
# The Api deployment's method that serves a `HandleRequest` (deployments/app.py).
HANDLE_METHOD = "handle_request"


@dataclass(frozen=True)
class HandleRequest:
    """One HTTP request, as sent over the deployment handle."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True)
class HandleResponse:
    """The first item of an answer: its status, headers and the body that came with them;
    `more` says whether body chunks (bytes items) follow."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    more: bool


def serve_handle(app_name: str = "orchestrator", deployment: str = "Api") -> Any:
    """The application's `Api` deployment handle, from a process joined to the cluster
    (`ray.init(address=...)` or a Ray job). Ray is imported here only: the rest of the SDK
    runs where Ray is not installed."""
    serve = importlib.import_module("ray.serve")
    return serve.get_deployment_handle(deployment, app_name=app_name)


def _wire(request: httpx.Request, body: bytes) -> HandleRequest:
    return HandleRequest(
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers=tuple(request.headers.raw),
        body=body,
    )


def _streaming(handle: Any) -> Any:
    return handle.options(method_name=HANDLE_METHOD, stream=True)


def _response(request: httpx.Request, head: Any, stream: Any) -> httpx.Response:
    if not isinstance(head, HandleResponse):
        raise httpx.RemoteProtocolError(
            f"the Api deployment answered {type(head).__name__}, not a HandleResponse",
            request=request,
        )
    return httpx.Response(head.status, headers=list(head.headers), stream=stream, request=request)


class _Chunks(httpx.SyncByteStream):
    def __init__(self, first: bytes, more: bool, rest: Any) -> None:
        self._first = first
        self._more = more
        self._rest = rest
        self._done = not more

    def __iter__(self) -> Iterator[bytes]:
        if self._first:
            yield self._first
        if self._more:
            for chunk in self._rest:
                yield bytes(chunk)
        self._done = True

    def close(self) -> None:
        # A stream left before its end (a caller leaving /sync-events): stop the replica's
        # side too, as a closed connection would.
        if not self._done:
            self._done = True
            self._rest.cancel()


class _AsyncChunks(httpx.AsyncByteStream):
    def __init__(self, first: bytes, more: bool, rest: Any) -> None:
        self._first = first
        self._more = more
        self._rest = rest
        self._done = not more

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        if self._more:
            async for chunk in self._rest:
                yield bytes(chunk)
        self._done = True

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._rest.cancel()


class ServeTransport(httpx.BaseTransport):
    """httpx transport over the `Api` deployment handle (blocking; not from inside a running
    event loop, where Ray refuses blocking calls: use `AsyncServeTransport` there)."""

    def __init__(self, handle: Any) -> None:
        self._handle = _streaming(handle)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._handle.remote(_wire(request, request.read()))
        head = next(answer)
        more = isinstance(head, HandleResponse) and head.more
        first = head.body if isinstance(head, HandleResponse) else b""
        return _response(request, head, _Chunks(first, more, answer))


class AsyncServeTransport(httpx.AsyncBaseTransport):
    """httpx async transport over the `Api` deployment handle."""

    def __init__(self, handle: Any) -> None:
        self._handle = _streaming(handle)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._handle.remote(_wire(request, await request.aread()))
        head = await answer.__anext__()
        more = isinstance(head, HandleResponse) and head.more
        first = head.body if isinstance(head, HandleResponse) else b""
        return _response(request, head, _AsyncChunks(first, more, answer))


def in_cluster_client(
    token: str | None = None,
    *,
    app_name: str = "orchestrator",
    handle: Any = None,
    timeout: float = 30.0,
    max_retries: int = 2,
) -> Client:
    """A `Client` whose requests go over the application's deployment handle, acting as
    `token` (default $ORCH_API_KEY). `handle` defaults to `serve_handle(app_name)`."""
    from orchestrator.sdk._client import Client  # here: _client may offer this as a method

    transport = ServeTransport(handle if handle is not None else serve_handle(app_name))
    http = httpx.Client(transport=transport, base_url=HANDLE_BASE_URL, timeout=timeout)
    return Client(
        HANDLE_BASE_URL, token=token, timeout=timeout, max_retries=max_retries, http_client=http
    )


def in_cluster_async_client(
    token: str | None = None,
    *,
    app_name: str = "orchestrator",
    handle: Any = None,
    timeout: float = 30.0,
    max_retries: int = 2,
) -> AsyncClient:
    """`in_cluster_client` for asyncio programs (a Ray actor, an async driver)."""
    from orchestrator.sdk._async_client import AsyncClient

    transport = AsyncServeTransport(handle if handle is not None else serve_handle(app_name))
    http = httpx.AsyncClient(transport=transport, base_url=HANDLE_BASE_URL, timeout=timeout)
    return AsyncClient(
        HANDLE_BASE_URL, token=token, timeout=timeout, max_retries=max_retries, http_client=http
    )
