"""`ActorHost`: what every process of a generation has, written once.

Each actor (AgentWorker, WorkflowShard, Scheduler, ChannelHub, EventBus, InferenceInstance)
and the Runtime replica that owns them subclass it. It gives the process
- its logs configured (`_configure_logs`: the actors' JSON lines; the Runtime replica
  overrides it with Serve's),
- its `MetricsRecorder`, drained every second into the generation's Metrics actor (kept and
  sent later while that actor is away; `_before_flush` sets gauges first),
- its one `Supervisor` (restarts counted by the recorder, so they reach
  svc_background_restarts_total): every loop of the process runs under it, and the
  components it builds take it,
- `_boot(start)`: the process's start, run under the supervisor until it succeeds. `start`
  registers what it opens on the exit stack it is given; a failed try's stack is closed
  (what it opened, in reverse) and the start tried again after the supervisor's backoff: an
  actor whose start failed once (Postgres restarting) does not stay broken for every later
  call, and leaks nothing; a try cancelled midway (a drain) closes its stack too,
- `watch()`: a call that never answers while the actor lives, so its caller (the Runtime
  replica) learns of the actor's death by the call failing, without polling Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

from actors import Generation, Watched
from actors.metrics import ActorMetricsHub
from orchestrator.config import Settings
from orchestrator.observability import MetricsPusher, MetricsRecorder, configure_actor_logs
from orchestrator.runtime.supervisor import Supervisor

T = TypeVar("T")

METRICS_FLUSH_S = 1.0


class ActorHost(Watched):
    """Base of a generation's processes: logs, recorder and its flush, supervisor, boot.
    `generation` None: no Metrics actor to push to (an inference instance outlives
    generations)."""

    def __init__(self, name: str, settings: Settings, generation: Generation | None) -> None:
        self._configure_logs(settings)
        self._name = name
        self._settings = settings
        self._recorder = MetricsRecorder(f"{name}:{socket.gethostname()}:{os.getpid()}")
        self._supervisor = Supervisor(name, on_restart=self._recorder.background_restart)
        if generation is not None:
            pusher = MetricsPusher(self._recorder, ActorMetricsHub(generation))
            self._supervisor.spawn("metrics-flush", lambda: self._flush_metrics(pusher))

    def _configure_logs(self, settings: Settings) -> None:
        # (that also quiets httpx's URL lines: a Telegram URL holds a bot token)
        configure_actor_logs(settings.log_format, settings.log_level)

    def _before_flush(self) -> None:
        """Gauges this process sets just before each push (none by default)."""

    async def _flush_metrics(self, pusher: MetricsPusher) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            self._before_flush()
            with contextlib.suppress(Exception):  # the Metrics actor may be restarting
                await pusher.flush()

    def _boot(self, start: Callable[[contextlib.AsyncExitStack], Awaitable[T]]) -> asyncio.Task[T]:
        """Run `start(opened)` as the supervisor's task `boot` until it succeeds, closing a
        failed (or cancelled) try's `opened`; the task's result is what it started (methods
        await it). What a successful start opened lives as long as the process."""
        tries: list[contextlib.AsyncExitStack] = []

        async def attempt() -> T:
            tries.append(contextlib.AsyncExitStack())
            return await start(tries[-1])

        async def undo() -> None:
            await tries.pop().aclose()

        return self._supervisor.retry("boot", attempt, undo=undo)
