"""One supervisor for the long-lived loops of a process (a replica or an actor).

Every background loop is spawned here under a name: the supervisor keeps the task's
reference (an unreferenced task can be garbage-collected mid-run and its exception is
never seen), restarts it when it fails or returns, with exponential backoff and jitter,
logs each restart with its traceback and reports it through `on_restart` (the owner
counts it in `svc_background_restarts_total{task}`), and on `aclose` cancels every task
and awaits it. It imports nothing of Ray: actors and replicas pass their recorder in.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# A run this long resets the backoff: the loop was healthy, its next failure is news.
HEALTHY_RUN_S = 60.0
# A task that has not stopped this long after its cancel is cancelled again (cancel_and_wait).
RECANCEL_S = 0.25


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]],
    timeout: float | None = None,  # noqa: ASYNC109 (bounds the wait after cancelling)
) -> set[asyncio.Future[Any]]:
    """Cancel `tasks` and wait until each has finished (at most `timeout`); return those
    still running. Their exceptions are taken (not logged as never retrieved).

    A task still running after RECANCEL_S is cancelled again: Python 3.11's
    `asyncio.wait_for` loses a cancel that arrives as its inner call completes (fixed in
    3.12), and redis-py and asyncpg await through it, so a loop could swallow its one cancel
    and go on, holding whoever awaited it (an app's shutdown waited out its whole timeout,
    and a test's teardown hung)."""
    given = list(tasks)
    pending = {task for task in given if not task.done()}
    done: set[asyncio.Future[Any]] = {task for task in given if task.done()}
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        for task in pending:
            task.cancel()
        wait = RECANCEL_S if deadline is None else min(RECANCEL_S, deadline - time.monotonic())
        if wait <= 0:
            break
        finished, pending = await asyncio.wait(pending, timeout=wait)
        done |= finished
    for task in done:
        if not task.cancelled():
            task.exception()
    return pending


class Supervisor:
    """Named, restarted, awaited background tasks of one owner (`owner` is for logs)."""

    def __init__(
        self,
        owner: str,
        *,
        on_restart: Callable[[str], None] | None = None,
        base_delay: float = 0.5,
        max_delay: float = 30.0,
        healthy_after: float = HEALTHY_RUN_S,
    ) -> None:
        self.owner = owner
        self._on_restart = on_restart
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._healthy_after = healthy_after
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restarts: dict[str, int] = {}
        self._closed = False

    def spawn(
        self, name: str, fn: Callable[[], Awaitable[None]], *, restart: bool = True
    ) -> asyncio.Task[None]:
        """Run `fn()` as the task `name`; with `restart`, run it again whenever it raises
        or returns. Without, a failure is logged and the task ends."""
        if self._closed:
            raise RuntimeError(f"supervisor {self.owner} is closed; cannot spawn {name}")
        running = self._tasks.get(name)
        if running is not None and not running.done():
            raise ValueError(f"{self.owner} already runs a task named {name!r}")
        task = asyncio.get_running_loop().create_task(
            self._supervise(name, fn, restart), name=f"{self.owner}:{name}"
        )
        self._tasks[name] = task
        task.add_done_callback(lambda done: self._forget(name, done))
        return task

    def tasks(self) -> dict[str, asyncio.Task[None]]:
        """The tasks still running, by name."""
        return dict(self._tasks)

    def restarts(self) -> dict[str, int]:
        """Restarts per task name since this supervisor was made."""
        return dict(self._restarts)

    async def aclose(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 (bounds the wait after cancelling, not the call)
        """Cancel every task and wait (up to `timeout`) until each has finished."""
        self._closed = True
        pending = await cancel_and_wait(self._tasks.values(), timeout)
        for task in pending:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.error("%s: task %s did not stop within %.1fs", self.owner, name, timeout)

    def _forget(self, name: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]

    async def _supervise(self, name: str, fn: Callable[[], Awaitable[None]], restart: bool) -> None:
        failures = 0
        me = asyncio.current_task()
        while True:
            started = time.monotonic()
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                if not restart:
                    log.exception("%s: task %s failed", self.owner, name)
                    return
                log.exception("%s: task %s failed; restarting", self.owner, name)
            else:
                if not restart:
                    return
                log.error("%s: task %s returned; restarting", self.owner, name)
            # A loop that swallowed our cancel and returned must not be restarted.
            if self._closed or (me is not None and me.cancelling()):
                raise asyncio.CancelledError
            failures = 1 if time.monotonic() - started >= self._healthy_after else failures + 1
            self._restarts[name] = self._restarts.get(name, 0) + 1
            if self._on_restart is not None:
                try:
                    self._on_restart(name)
                except Exception:
                    log.exception("%s: counting the restart of %s failed", self.owner, name)
            await asyncio.sleep(self._delay(failures))

    def _delay(self, failures: int) -> float:
        # Exponential, capped, with jitter in [d/2, d]: replicas that failed together
        # (a database outage) do not all retry in the same instant.
        delay: float = min(self._max_delay, self._base_delay * 2 ** min(failures - 1, 30))
        return delay * (0.5 + random.random() / 2)
