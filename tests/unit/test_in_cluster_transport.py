"""The in-cluster transports keep httpx's read timeout, as HTTP does: a replica that sends
nothing (no head, or no chunk of a stream: not even the ping `/sync-events` sends every
`sse_ping_interval_s`) is a `httpx.ReadTimeout` for the caller, and its request is cancelled,
instead of a read that waits forever. The handles here stand in for Serve's
`handle.options(stream=True)`: their answers block until cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator.sdk._in_cluster import (
    HANDLE_BASE_URL,
    AsyncServeTransport,
    HandleResponse,
    ServeTransport,
)

HEAD = HandleResponse(200, ((b"content-type", b"text/event-stream"),), b": connected\n\n", True)


class _StalledAnswer:
    """Gives `items`, then blocks (a sync read) or waits (an async one) until cancelled."""

    def __init__(self, items: list[Any]) -> None:
        self._items = iter(items)
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        for item in self._items:
            return item
        self.cancelled.wait(30)
        raise RuntimeError("cancelled")  # what a cancelled Ray read raises, more or less

    def __aiter__(self) -> _StalledAnswer:
        return self

    async def __anext__(self) -> Any:
        for item in self._items:
            return item
        await asyncio.to_thread(self.cancelled.wait, 30)
        raise RuntimeError("cancelled")

    def cancel(self) -> None:
        self.cancelled.set()


class _Handle:
    def __init__(self, items: list[Any]) -> None:
        self.answer = _StalledAnswer(items)

    def options(self, **_: Any) -> _Handle:
        return self

    def remote(self, _request: Any) -> _StalledAnswer:
        return self.answer


@pytest.mark.parametrize("items", [[], [HEAD]], ids=["no head", "no chunk"])
def test_a_stalled_answer_is_a_read_timeout(items: list[Any]) -> None:
    handle = _Handle(items)
    started = time.monotonic()
    with httpx.Client(
        transport=ServeTransport(handle), base_url=HANDLE_BASE_URL, timeout=0.3
    ) as client:
        with pytest.raises(httpx.ReadTimeout):
            with client.stream("GET", "/sync-events") as stream:
                for _ in stream.iter_bytes():
                    pass
    assert handle.answer.cancelled.is_set()
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("items", [[], [HEAD]], ids=["no head", "no chunk"])
async def test_a_stalled_answer_is_a_read_timeout_async(items: list[Any]) -> None:
    handle = _Handle(items)
    transport = AsyncServeTransport(handle)
    async with httpx.AsyncClient(transport=transport, base_url=HANDLE_BASE_URL, timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            async with asyncio.timeout(10), c.stream("GET", "/sync-events") as stream:
                async for _ in stream.aiter_bytes():
                    pass
    assert handle.answer.cancelled.is_set()


def test_without_a_timeout_a_quiet_stream_is_waited_for() -> None:
    """timeout=None is HTTP's "wait forever" too: the chunk that comes late is read."""
    late = HandleResponse(200, (), b"", True)

    class Slow(_StalledAnswer):
        def __next__(self) -> Any:
            for item in self._items:
                if item == b"late":
                    time.sleep(0.5)
                return item
            raise StopIteration

    handle = _Handle([])
    handle.answer = Slow([late, b"late"])
    with httpx.Client(
        transport=ServeTransport(handle), base_url=HANDLE_BASE_URL, timeout=None
    ) as client:
        assert client.get("/x").content == b"late"
