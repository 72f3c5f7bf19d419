"""The API from a program on the Ray cluster, through the application's Serve deployment
handle instead of HTTP: the transport under `Client.in_cluster` and `AsyncClient.in_cluster`.

An httpx transport that sends each request, serialised as a `HandleRequest`, to the `Api`
deployment's `handle_request` method. That method runs it through the same FastAPI app a
replica serves HTTP with (deployments/in_cluster.py), request layers included, so the token in
`Authorization` is verified, rate limited and owns what it owns exactly as over HTTP: the
handle is a different wire, never a different set of rules. Answers come back as a stream:
a `HandleResponse` (status, headers, the body so far) then body chunks, so streaming routes
(`/sync-events`, streamed completions) work too.

Why a transport rather than a second client: every SDK method, present and future, works
in the cluster unchanged (`Client(http_client=httpx.Client(transport=ServeTransport(h)))`).

No Ray import here (the SDK must import without Ray): the caller passes the handle
(`serve.get_deployment_handle("Api", app_name=...)`), or `Client.in_cluster` looks it up
through `serve_handle`, which imports Ray only when called. This module imports neither
client (they import it).
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

from orchestrator.wire.handle import HandleRequest, HandleResponse

__all__ = ["HANDLE_BASE_URL", "AsyncServeTransport", "ServeTransport", "serve_handle"]

# The base URL of clients on this transport: only its path counts (`/api/v1`); the host
# names the wire in logs and errors.
HANDLE_BASE_URL = "http://ray-handle/api/v1"
# The Api deployment's method that serves a `HandleRequest` (deployments/app.py).
HANDLE_METHOD = "handle_request"


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


# A handle read has no timeout of its own. httpx's read timeout (`Client(timeout=...)`) is
# kept as over HTTP: no head, or no chunk of a stream, within it is a `httpx.ReadTimeout`
# and the request is cancelled, so a stalled replica never holds its caller forever (a live
# `/sync-events` sends a ping every `sse_ping_interval_s`, 15 s by default). Blocking reads
# wait in these threads; one per read in progress, idle ones exit.
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()
_END = object()  # the answer has no more items (StopIteration cannot cross a future)


def _read_timeout(request: httpx.Request) -> float | None:
    timeout = request.extensions.get("timeout", {})
    read = timeout.get("read") if isinstance(timeout, dict) else None
    return float(read) if read is not None else None


def _timed_out(request: httpx.Request, answer: Any, timeout: float) -> httpx.ReadTimeout:
    answer.cancel()  # the replica's side stops, as when a connection is closed
    return httpx.ReadTimeout(
        f"the Api deployment sent nothing for {timeout:g} s ({request.method} {request.url.path})",
        request=request,
    )


def _next_item(answer: Any) -> Any:
    try:
        return next(answer)
    except StopIteration:
        return _END


def _read(request: httpx.Request, answer: Any) -> Any:
    """The answer's next item (or `_END`) within the request's read timeout."""
    timeout = _read_timeout(request)
    if timeout is None:
        return _next_item(answer)
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(64, thread_name_prefix="orch-handle-read")
    pending = _readers.submit(_next_item, answer)
    try:
        return pending.result(timeout)
    except FutureTimeout:
        raise _timed_out(request, answer, timeout) from None


async def _aread(request: httpx.Request, answer: Any) -> Any:
    timeout = _read_timeout(request)
    try:
        return await asyncio.wait_for(answer.__anext__(), timeout)
    except StopAsyncIteration:
        return _END
    except TimeoutError:
        raise _timed_out(request, answer, timeout or 0.0) from None


def _response(request: httpx.Request, head: Any, stream: Any) -> httpx.Response:
    if not isinstance(head, HandleResponse):
        raise httpx.RemoteProtocolError(
            f"the Api deployment answered {type(head).__name__}, not a HandleResponse",
            request=request,
        )
    return httpx.Response(head.status, headers=list(head.headers), stream=stream, request=request)


class _Body:
    """A response body in flight: its first chunk, and the replica's generator of the rest
    (`more`) that a stream left before its end stops, as a closed connection would (a
    caller leaving /sync-events)."""

    def __init__(self, request: httpx.Request, first: bytes, more: bool, rest: Any) -> None:
        self._request = request
        self._first = first
        self._more = more
        self._rest = rest
        self._done = not more

    def _stop(self) -> None:
        if not self._done:
            self._done = True
            self._rest.cancel()


class _Chunks(_Body, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        if self._first:
            yield self._first
        while self._more:
            chunk = _read(self._request, self._rest)
            if chunk is _END:
                break
            yield bytes(chunk)
        self._done = True

    def close(self) -> None:
        self._stop()


class _AsyncChunks(_Body, httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        while self._more:
            chunk = await _aread(self._request, self._rest)
            if chunk is _END:
                break
            yield bytes(chunk)
        self._done = True

    async def aclose(self) -> None:
        self._stop()


class ServeTransport(httpx.BaseTransport):
    """httpx transport over the `Api` deployment handle (blocking; not from inside a running
    event loop, where Ray refuses blocking calls: use `AsyncServeTransport` there)."""

    def __init__(self, handle: Any) -> None:
        self._handle = _streaming(handle)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._handle.remote(_wire(request, request.read()))
        head = _read(request, answer)
        more = isinstance(head, HandleResponse) and head.more
        first = head.body if isinstance(head, HandleResponse) else b""
        return _response(request, head, _Chunks(request, first, more, answer))


class AsyncServeTransport(httpx.AsyncBaseTransport):
    """httpx async transport over the `Api` deployment handle."""

    def __init__(self, handle: Any) -> None:
        self._handle = _streaming(handle)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._handle.remote(_wire(request, await request.aread()))
        head = await _aread(request, answer)
        more = isinstance(head, HandleResponse) and head.more
        first = head.body if isinstance(head, HandleResponse) else b""
        return _response(request, head, _AsyncChunks(request, first, more, answer))
