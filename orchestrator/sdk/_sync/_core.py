# Generated from orchestrator/sdk/_async/_core.py by scripts/unasync_sdk.py: do not edit.
"""What every method of the client stands on: one request sent with the retry policy
(orchestrator/sdk/_base.py), a stream read as Server-Sent Events, the client's lifetime, and
walking a paged list."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from orchestrator.sdk._base import (
    Call,
    RetryPolicy,
    SseFrame,
    SseParser,
    SyncPages,
    carries_key,
    error_of,
    headers_for,
    read,
    resolve_options,
)
from orchestrator.sdk._serve_transport import HANDLE_BASE_URL, ServeTransport, serve_handle

__all__ = ["SyncCore", "offset_pages"]

T = TypeVar("T")


class SyncCore:
    """Sends `Call`s: over its own httpx client, or the one it is given (`http_client`: any
    transport, proxies, mTLS; used as given and not closed by the client)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url, self.api_key = resolve_options(base_url, api_key or token)
        self.timeout = timeout
        self.retry = RetryPolicy(max_retries=max_retries)
        self._headers = headers_for(self.api_key)
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(timeout=timeout)

    @classmethod
    def in_cluster(
        cls,
        token: str | None = None,
        *,
        app_name: str = "orchestrator",
        handle: Any = None,
        timeout: float = 30.0,
        max_retries: int = 2,
    ) -> Self:
        """From a program on the Ray cluster (a driver joined with `ray.init`, a Ray job):
        requests go over the application's `Api` deployment handle instead of HTTP, acting
        as `token` (default $ORCH_API_KEY) with the same auth, limits and ownership
        (orchestrator/sdk/_serve_transport.py). `handle` defaults to the `Api` deployment of
        `app_name`, looked up through Ray, which is imported then."""
        transport = ServeTransport(handle if handle is not None else serve_handle(app_name))
        http = httpx.Client(transport=transport, base_url=HANDLE_BASE_URL, timeout=timeout)
        return cls(
            HANDLE_BASE_URL, token=token, timeout=timeout, max_retries=max_retries, http_client=http
        )

    @property
    def max_retries(self) -> int:
        return self.retry.max_retries

    def _request(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method,
                self.base_url + call.path,
                json=call.body,
                params=call.params,
                headers={**self._headers, **(call.headers or {})},
                timeout=self.timeout,
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries or not self.retry.should_retry_error(
                    call.method, exc, keyed=carries_key(call)
                ):
                    raise
                delay = self.retry.delay(attempt, None)
            else:
                if attempt >= self.max_retries or not self.retry.should_retry_status(
                    call, response
                ):
                    return response
                delay = self.retry.delay(attempt, response)
                response.close()
            attempt += 1
            time.sleep(delay)

    def _send(self, call: Call[T]) -> T:
        return read(call, self._request(call))

    def _sse(self, call: Call[None], parser: SseParser) -> Generator[SseFrame, None]:
        response = self._request(call, stream=True)
        try:
            if not response.is_success:
                response.read()
                raise error_of(response)
            for line in response.iter_lines():
                frame = parser.line(line)
                if frame is not None:
                    yield frame
        finally:
            response.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


def offset_pages(fetch: SyncPages[T], page_size: int) -> Iterator[T]:
    """Every item of a list paged by offset, a page of `page_size` at a time."""
    offset = 0
    while True:
        items = fetch(offset)
        for item in items:
            yield item
        if len(items) < page_size:
            return
        offset += len(items)
