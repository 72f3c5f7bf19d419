"""One supervisor for the long-lived loops of a process (a replica or an actor).

Every process makes exactly one (a replica in its lifespan, an actor through
`actors.host.ActorHost`) and hands it to every component that runs background work: no
component makes its own. Every background loop is spawned here under a name: the supervisor
keeps the task's reference (an unreferenced task can be garbage-collected mid-run and its
exception is never seen), restarts it when it fails or returns, after the process's
`Backoff`, logs each restart with its traceback and reports it through `on_restart` (the
owner counts it in `svc_background_restarts_total{task}`), and on `aclose` cancels every
task and awaits it. `retry` runs a one-off start (an actor's boot) the same way until it
succeeds. It imports nothing of Ray: actors and replicas pass their recorder in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from orchestrator.runtime.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

# A run this long resets the backoff: the loop was healthy, its next failure is news.
HEALTHY_RUN_S = 60.0
# A task that has not stopped this long after its cancel is cancelled again (cancel_and_wait).
RECANCEL_S = 0.25
# Restarts and boot retries: 0.25-0.5 s after a first failure, doubling up to 15-30 s.
RESTART_BACKOFF = Backoff(base=0.5, cap=30.0, jitter=0.5)


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
    """Named, restarted, awaited background tasks of one process (`owner` is for logs)."""

    def __init__(
        self,
        owner: str,
        *,
        on_restart: Callable[[str], None] | None = None,
        backoff: Backoff = RESTART_BACKOFF,
        healthy_after: float = HEALTHY_RUN_S,
    ) -> None:
        self.owner = owner
        self.backoff = backoff
        self._on_restart = on_restart
        self._healthy_after = healthy_after
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._restarts: dict[str, int] = {}
        self._closed = False

    def spawn(
        self,
        name: str,
        fn: Callable[[], Awaitable[None]],
        *,
        restart: bool = True,
        expected: tuple[type[Exception], ...] = (),
    ) -> asyncio.Task[None]:
        """Run `fn()` as the task `name`; with `restart`, run it again whenever it raises
        or returns. Without, a failure is logged and the task ends. A failure of an
        `expected` type (a loop's known way to end: a lost lease, a lost connection) is
        logged as one warning line instead of a traceback, and restarted all the same."""
        return self._start(name, self._supervise(name, fn, restart, expected))

    def retry(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        undo: Callable[[], Awaitable[None]] | None = None,
    ) -> asyncio.Task[T]:
        """Run `fn()` as the task `name` until it returns; the task's result is its result.
        Each failure is logged, counted as a restart, undone (`undo()`: what a half-done try
        opened) and tried again after the backoff: a start that failed once (Postgres
        restarting) must not leave its process broken for every call made to it after. A
        try cancelled midway is undone as well before the task ends cancelled."""
        return self._start(name, self._until_done(name, fn, undo))

    def tasks(self) -> dict[str, asyncio.Task[Any]]:
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

    def _start(self, name: str, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        running = self._tasks.get(name)
        if self._closed or (running is not None and not running.done()):
            work.close()  # never started: no "coroutine was never awaited" warning
            if self._closed:
                raise RuntimeError(f"supervisor {self.owner} is closed; cannot spawn {name}")
            raise ValueError(f"{self.owner} already runs a task named {name!r}")
        task = asyncio.get_running_loop().create_task(work, name=f"{self.owner}:{name}")
        self._tasks[name] = task
        task.add_done_callback(lambda done: self._forget(name, done))
        return task

    def _forget(self, name: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]

    async def _supervise(
        self,
        name: str,
        fn: Callable[[], Awaitable[None]],
        restart: bool,
        expected: tuple[type[Exception], ...],
    ) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except expected as exc:
                again = "; restarting" if restart else ""
                log.warning("%s: task %s ended (%r)%s", self.owner, name, exc, again)
                if not restart:
                    return
            except Exception:
                if not restart:
                    log.exception("%s: task %s failed", self.owner, name)
                    return
                log.exception("%s: task %s failed; restarting", self.owner, name)
            else:
                if not restart:
                    return
                log.error("%s: task %s returned; restarting", self.owner, name)
            failures = await self._after_failure(name, failures, started)

    async def _until_done(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        undo: Callable[[], Awaitable[None]] | None,
    ) -> T:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                return await fn()
            except asyncio.CancelledError:
                # A try cancelled midway (a drain, aclose) is undone too, to its end: what
                # it opened is closed before the task ends, whatever cancels come meanwhile.
                if undo is not None:
                    undoing = asyncio.ensure_future(self._undo(name, undo))
                    while not undoing.done():
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.shield(undoing)
                raise
            except Exception:
                log.exception("%s: %s failed; trying again", self.owner, name)
            if undo is not None:
                await self._undo(name, undo)
            failures = await self._after_failure(name, failures, started)

    async def _undo(self, name: str, undo: Callable[[], Awaitable[None]]) -> None:
        try:
            await undo()
        except Exception:
            log.exception("%s: undoing the failed %s failed", self.owner, name)

    async def _after_failure(self, name: str, failures: int, started: float) -> int:
        """Count the restart and wait out the backoff; the failures in a row so far."""
        # A loop that swallowed our cancel and returned must not be restarted.
        me = asyncio.current_task()
        if self._closed or (me is not None and me.cancelling()):
            raise asyncio.CancelledError
        failures = 1 if time.monotonic() - started >= self._healthy_after else failures + 1
        self._restarts[name] = self._restarts.get(name, 0) + 1
        if self._on_restart is not None:
            try:
                self._on_restart(name)
            except Exception:
                log.exception("%s: counting the restart of %s failed", self.owner, name)
        await asyncio.sleep(self.backoff.delay(failures))
        return failures
