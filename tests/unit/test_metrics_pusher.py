"""The pusher that sends a process's metric deltas to the cluster-wide hub."""

from __future__ import annotations

import asyncio

from orchestrator.observability import MetricsPusher, MetricsRecorder, MetricsSnapshot


class SlowSink:
    """A hub that takes a moment per push (an actor call), recording what it accepted."""

    def __init__(self) -> None:
        self.pushed: list[MetricsSnapshot] = []

    async def push(self, snapshot: MetricsSnapshot) -> None:
        await asyncio.sleep(0.01)
        self.pushed.append(snapshot)


async def test_concurrent_flushes_push_each_snapshot_once() -> None:
    """The periodic flush and a /metrics request flushing at once: each snapshot reaches the
    hub once (before: the oldest twice, then `pop from empty list`, a 500 on /metrics)."""
    recorder = MetricsRecorder("test")
    sink = SlowSink()
    pusher = MetricsPusher(recorder, sink)
    recorder.event("x.happened")
    await asyncio.gather(pusher.flush(), pusher.flush(), pusher.flush())
    assert sum(s.events.get("x.happened", 0) for s in sink.pushed) == 1
    assert len(sink.pushed) == 3  # one drain per flush, none pushed twice
