"""Sending a process's metric deltas to the cluster-wide hub, without losing them when the
hub is briefly away (kept and sent first next time, up to a bound)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from orchestrator.observability._recorder import MetricsRecorder, MetricsSnapshot

MAX_UNSENT_SNAPSHOTS = 300  # five minutes of one-second flushes


class SnapshotSink(Protocol):
    async def push(self, snapshot: MetricsSnapshot) -> None: ...


class MetricsPusher:
    def __init__(self, recorder: MetricsRecorder, sink: SnapshotSink) -> None:
        self.recorder = recorder
        self._sink = sink
        self._unsent: list[MetricsSnapshot] = []
        # One flush at a time: the periodic flush and a /metrics request flushing first
        # would otherwise both push the oldest snapshot (counted twice) and pop twice.
        self._lock = asyncio.Lock()

    async def flush(self) -> None:
        """Drain the recorder and push everything not yet accepted, oldest first."""
        async with self._lock:
            self._unsent.append(self.recorder.drain())
            del self._unsent[:-MAX_UNSENT_SNAPSHOTS]
            while self._unsent:
                await self._sink.push(self._unsent[0])
                self._unsent.pop(0)
