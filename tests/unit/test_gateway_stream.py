"""How the gateway forwards a stream: `_batches` (deployments/routers/gateway.py) turns the
upstream's events into batches (a burst is one write), heartbeats while it is silent, and
never cancels a pending read for a heartbeat."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from deployments.routers.gateway import _batches
from orchestrator.providers import BlockDelta, ProviderError, StreamEvent


def delta(text: str) -> BlockDelta:
    return BlockDelta(0, text)


async def test_a_burst_is_one_batch_and_silence_a_heartbeat() -> None:
    release = asyncio.Event()
    reads_cancelled = 0

    async def upstream() -> AsyncIterator[StreamEvent]:
        nonlocal reads_cancelled
        for text in "abc":
            yield delta(text)
        try:
            await release.wait()  # silent: heartbeats, while this read stays pending
        except asyncio.CancelledError:
            reads_cancelled += 1
            raise
        yield delta("d")

    seen: list[list[StreamEvent] | None] = []
    async with contextlib.aclosing(_batches(upstream(), 0.01)) as batches:
        async for batch in batches:
            seen.append(batch)
            if seen.count(None) == 3:
                release.set()
    assert seen[0] == [delta("a"), delta("b"), delta("c")]
    assert seen[1:4] == [None, None, None]
    assert seen[4:] == [[delta("d")]]
    assert reads_cancelled == 0


async def test_a_failure_comes_after_what_arrived_before_it() -> None:
    async def upstream() -> AsyncIterator[StreamEvent]:
        yield delta("a")
        raise ProviderError("upstream broke", provider="x")

    got: list[list[StreamEvent] | None] = []
    with pytest.raises(ProviderError, match="upstream broke"):
        async with contextlib.aclosing(_batches(upstream(), 10)) as batches:
            async for batch in batches:
                got.append(batch)
    assert got == [[delta("a")]]


async def test_closing_stops_the_reader_before_the_upstream_is_closed() -> None:
    finished = asyncio.Event()

    async def upstream() -> AsyncIterator[StreamEvent]:
        try:
            yield delta("a")
            await asyncio.Event().wait()  # never answers
            yield delta("never")
        finally:
            finished.set()

    events = upstream()
    async with contextlib.aclosing(_batches(events, 10)) as batches:
        assert await anext(batches) == [delta("a")]
    assert finished.is_set()  # the pending read was cancelled: the upstream can be closed
    await events.aclose()  # no "already running"
