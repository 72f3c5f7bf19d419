"""The workflow engine: drives workflows, each a supervised asyncio task; how a driver
goes through a workflow's steps (through the store's transitions, task steps on the agent
runtime, a `TaskDispatcher`) is in _driving.py. Here, what is around the drivers:

- Ownership: a driver first acquires the workflow's claim (orchestrator/runtime/claims.py,
  kind `workflow`), renews it every third of `workflow_claim_ttl_ms` while driving, and
  passes its fence to every transition: a driver whose claim was taken over (a zombie: an
  old actor generation, a shard of an older `workflow_shards`, a paused process) has its
  next write rejected (StaleClaim) and stops. The step's start (and its task's
  task.created) commits under the fence before the task is dispatched, so a zombie cannot
  dispatch a new attempt. A workflow whose claim is free (never started, driver dead) is
  taken by the next sweep of any live engine (`sweep`, every third of the TTL).
- Database work is admitted fairly across tenants (_admission.py): a driver holds one of
  the shard's `workflow_shard_max_active` slots for its transitions, gives it up while it
  waits on its agent task, its children or a backoff, and queues again after.
- Infrastructure failures (the database, an actor: anything raised rather than a failed
  task result) are retried with doubling, jittered backoff from `workflow_retry_base_ms` up
  to `workflow_retry_max_ms`; `workflow_retry_attempts` in a row (progress resets the count)
  fail the workflow with the reason (compensation first; if that fails too, failed at
  once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import asyncpg

from orchestrator.agents import TaskDispatcher
from orchestrator.config import Settings
from orchestrator.errors import Conflict, NotFound
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.claims import ClaimStore, Fence, StaleClaim
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait
from orchestrator.workflows._admission import DriverAdmission
from orchestrator.workflows._driving import Starter, WorkflowDriving, _Parked
from orchestrator.workflows._patterns import PatternRunner
from orchestrator.workflows._states import FINISHED, WorkflowState
from orchestrator.workflows._store import (
    CLAIM_KIND,
    NOTIFY_CHANNEL,
    WorkflowRecord,
    WorkflowStore,
)

if TYPE_CHECKING:
    from orchestrator.interventions import InterventionStore

log = logging.getLogger(__name__)
T = TypeVar("T")

Canceller = Callable[[str], Awaitable[str]]
CHILD_RECHECK_S = 10.0  # a safety net only: children's ends arrive by NOTIFY
CANCEL_WAIT_S = 30.0
SWEEP_BATCH = 200
EXPIRE_BATCH = 100  # interventions past their expiry, rejected per sweep
_DONE = frozenset(str(s) for s in FINISHED)
# Names of the engine's tasks in its supervisor.
_DRIVER, _INTERRUPT, _LISTENER, _SWEEP = "drive ", "interrupt ", "workflow-listener", "sweep"


class _Drained(Exception):
    """The engine drains: a driver waiting on children stops (they are resumed elsewhere)."""


class WorkflowEngine(WorkflowDriving):
    def __init__(
        self,
        store: WorkflowStore,
        dispatcher: TaskDispatcher,
        settings: Settings,
        *,
        starter: Starter | None = None,
        canceller: Canceller | None = None,
        owner: str | None = None,
        supervisor: Supervisor,
        shard: tuple[int, int] = (0, 1),
        interventions: InterventionStore | None = None,
    ) -> None:
        self._store = store
        self._interventions = interventions
        self._dispatcher = dispatcher
        self._settings = settings
        self._starter = starter or self.start
        self._canceller = canceller or self.cancel
        # An actor passes its name: a restarted incarnation takes its claims back at once
        # (with new epochs: the old one, were it still alive, is fenced off).
        self.owner = owner or f"engine/{uuid.uuid4().hex[:12]}"
        self._claims = ClaimStore(store.pool, settings.workflow_claim_ttl_ms)
        # The process's supervisor: drivers, interrupts, the listener and the sweep run
        # under it (named by workflow, so `shutdown` stops exactly this engine's tasks).
        self._sup = supervisor
        # Infrastructure failures of a workflow in a row: doubling, jittered waits.
        self._retry_backoff = Backoff(
            base=settings.workflow_retry_base_ms / 1000, cap=settings.workflow_retry_max_ms / 1000
        )
        self._shard = shard
        self._fences: dict[str, Fence] = {}
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._progress: dict[str, int] = {}
        # Drivers that began with the workflow already ending: a cancel needs no interrupt.
        self._knows_ending: set[str] = set()
        self._patterns = PatternRunner(settings.workflow_pattern_budget_ms)
        self._admission = DriverAdmission(
            settings.workflow_shard_max_active, settings.workflow_shard_tenant_share
        )
        self._listening = asyncio.Event()
        self._loops_started = False
        self._closed = False
        self._draining = False

    @property
    def store(self) -> WorkflowStore:
        return self._store

    @property
    def claims(self) -> ClaimStore:
        return self._claims

    @property
    def admission(self) -> DriverAdmission:
        return self._admission

    def running_count(self) -> int:
        return sum(1 for name in self._sup.tasks() if name.startswith(_DRIVER))

    def _driver(self, workflow_id: str) -> asyncio.Task[None] | None:
        task = self._sup.tasks().get(_DRIVER + workflow_id)
        return task if task is not None and not task.done() else None

    def _ensure_loops(self) -> None:
        """The listener and the sweep, once (they need the running loop)."""
        if self._loops_started or self._closed:
            return
        self._loops_started = True
        if self._settings.database_url:
            self._sup.spawn(_LISTENER, self._listen)
        self._sup.spawn(_SWEEP, self._sweep_forever)

    async def start(self, workflow_id: str) -> None:
        """Drive the workflow here (no-op when it already is here; a driver elsewhere keeps
        it: this one finds the claim taken and ends)."""
        if self._closed or self._driver(workflow_id) is not None:
            return
        self._ensure_loops()
        self._sup.spawn(_DRIVER + workflow_id, lambda: self._own(workflow_id), restart=False)

    async def resume_unfinished(self, shard_index: int = 0, shards: int = 1) -> int:
        """Start driving every unfinished workflow nobody drives (this shard's first)."""
        self._shard = (shard_index, shards)
        self._ensure_loops()
        return await self.sweep()

    async def sweep(self) -> int:
        """Take up unfinished workflows without a live claim; how many were found."""
        shard_index, shards = self._shard
        ids = await self._store.unclaimed(SWEEP_BATCH, self.owner, shard_index, shards)
        for workflow_id in ids:
            await self.start(workflow_id)
        return len(ids)

    async def _sweep_forever(self) -> None:
        period = self._settings.workflow_claim_ttl_ms / 3000
        while True:
            await asyncio.sleep(period * (0.75 + random.random() / 2))
            await self.expire_interventions()
            await self.sweep()

    async def expire_interventions(self) -> int:
        """Reject the interventions past their expiry (issue 32: every engine's sweep does,
        SKIP LOCKED keeps them apart) and start the workflows that waited for them."""
        if self._interventions is None:
            return 0
        try:
            released = await self._interventions.expire_due(EXPIRE_BATCH)
        except (OSError, asyncpg.PostgresError) as exc:  # the next sweep tries again
            log.warning("expiring interventions: %r", exc)
            return 0
        for workflow_id in released:
            await self._starter(workflow_id)
        return len(released)

    async def cancel(self, workflow_id: str) -> str:
        """Cancel a pending or running workflow; its status once compensation ended (or
        `running` while compensation still runs after CANCEL_WAIT_S)."""
        record = await self._store.load(workflow_id)
        if record is None:
            raise NotFound(f"workflow {workflow_id} not found")
        if record.finished:
            raise Conflict(
                f"workflow {workflow_id} is {record.status}: only a pending or running"
                " workflow can be cancelled",
                extra={"status": str(record.status)},
            )
        driver = self._driver(workflow_id)
        if driver is not None and record.ending is None:
            await cancel_and_wait([driver])
        # Not fenced: a request, from anywhere. A driver elsewhere hears `cancel:<id>`.
        await self._store.begin_ending(workflow_id, "cancelled", "cancelled by request")
        try:
            # Children at once; one that cannot be reached (its shard down, slow to
            # compensate) is not a reason to leave this workflow undriven.
            children = [c.id for c in await self._store.children(workflow_id) if not c.finished]
            outcomes = await asyncio.gather(
                *(self._canceller(child) for child in children), return_exceptions=True
            )
            for child, outcome in zip(children, outcomes, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, Conflict | NotFound
                ):
                    log.warning("cancelling child %s of %s: %r", child, workflow_id, outcome)
        finally:
            await self.start(workflow_id)
        with contextlib.suppress(TimeoutError):
            await self._until_finished([workflow_id], CANCEL_WAIT_S)
        final = await self._store.load(workflow_id)
        return str(final.status) if final is not None else "cancelled"

    async def wait(self, workflow_id: str, within: float = 60.0) -> WorkflowRecord:
        """Until the workflow has finished (tests, benchmarks)."""
        self._ensure_loops()
        await self._until_finished([workflow_id], within)
        record = await self._store.load(workflow_id)
        if record is None:
            raise NotFound(f"workflow {workflow_id} not found")
        return record

    async def shutdown(self, drain_s: float = 0.0) -> None:
        """Stop driving and give the claims up (state stays as it is: whichever engine
        sweeps next resumes at once, without waiting for the claims to expire). With
        `drain_s` (a generation being replaced), drivers first finish the step they are in
        (its result recorded) and stop before the next, for up to `drain_s`; what still
        runs then is cancelled (that step runs again, as a new attempt, where resumed)."""
        self._closed = True
        if drain_s > 0:
            self._draining = True
            self._wake_all()  # parents waiting on children, steps waiting to retry: stop
            drivers = [t for n, t in self._sup.tasks().items() if n.startswith(_DRIVER)]
            if drivers:
                await asyncio.wait(drivers, timeout=drain_s)
        ours = [
            t
            for n, t in self._sup.tasks().items()
            if n.startswith((_DRIVER, _INTERRUPT)) or n in (_LISTENER, _SWEEP)
        ]
        await cancel_and_wait(ours)
        self._patterns.close()

    async def close(self) -> None:
        await self.shutdown()

    # --- hearing about workflows --------------------------------------------------------------

    async def _listen(self) -> None:
        """LISTEN orch_workflows: ends wake waiters; a cancel stops the step we drive."""
        assert self._settings.database_url
        conn = await asyncpg.connect(self._settings.database_url)
        closed = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _: closed.set())
            await conn.add_listener(NOTIFY_CHANNEL, self._notified)
            self._listening.set()
            # Whatever ended while we were not listening: every waiter looks again.
            self._wake_all()
            await closed.wait()
            raise ConnectionError("the workflow listener's connection closed")
        finally:
            self._listening.clear()
            with contextlib.suppress(Exception):
                await conn.close()

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        what, _, workflow_id = payload.partition(":")
        if what == "done":
            for event in self._waiters.get(workflow_id, ()):
                event.set()
        elif what == "override":
            # An override (_overrides.py) revoked the claim at this epoch: stop the driver
            # holding it and drive again (a driver under a newer claim is not concerned).
            workflow_id, _, epoch = workflow_id.partition(":")
            fence = self._fences.get(workflow_id)
            if fence is not None and epoch.isdigit() and fence.epoch <= int(epoch):
                self._sup.spawn(
                    f"{_INTERRUPT}{workflow_id} {uuid.uuid4().hex[:6]}",
                    lambda: self._interrupt(workflow_id),
                    restart=False,
                )
        elif (
            what == "cancel"
            and self._driver(workflow_id) is not None
            and workflow_id not in self._knows_ending
        ):
            self._sup.spawn(
                f"{_INTERRUPT}{workflow_id} {uuid.uuid4().hex[:6]}",
                lambda: self._interrupt(workflow_id),
                restart=False,
            )

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def _interrupt(self, workflow_id: str) -> None:
        """Cancelled elsewhere: abandon the running step, drive on (compensation)."""
        driver = self._driver(workflow_id)
        if driver is not None:
            await cancel_and_wait([driver])
        await self.start(workflow_id)

    async def _until_finished(self, ids: Sequence[str], within: float | None = None) -> None:
        """Until every workflow of `ids` has finished (woken by their `done` NOTIFY)."""
        event = asyncio.Event()
        for workflow_id in ids:
            self._waiters.setdefault(workflow_id, set()).add(event)
        deadline = None if within is None else time.monotonic() + within
        try:
            while True:
                event.clear()
                statuses = await self._store.statuses(ids)
                if all(statuses.get(i, "cancelled") in _DONE for i in ids):
                    return
                wait = CHILD_RECHECK_S if self._listening.is_set() else 0.5
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"workflows still running: {', '.join(ids)}")
                    wait = min(wait, left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), wait)
                if self._draining and within is None:
                    raise _Drained
        finally:
            for workflow_id in ids:
                waiting = self._waiters.get(workflow_id)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[workflow_id]

    # --- owning and driving ---------------------------------------------------------------

    async def _own(self, workflow_id: str) -> None:
        fence = await self._claims.acquire(CLAIM_KIND, workflow_id, self.owner)
        if fence is None:
            return  # driven elsewhere; a sweep takes it up if that driver dies
        self._fences[workflow_id] = fence
        driver = asyncio.current_task()
        assert driver is not None
        renewer = asyncio.create_task(self._renew(fence, driver), name=f"renew {workflow_id}")
        try:
            await self._drive_with_retries(workflow_id, fence)
        except StaleClaim as exc:
            log.warning("workflow %s: no longer ours, stopping (%s)", workflow_id, exc)
        except _Drained:
            log.info("workflow %s: handed over (draining)", workflow_id)
        except _Parked as parked:
            log.info("workflow %s: waits for %s, parked", workflow_id, parked)
        finally:
            # Everything synchronous before the first await: a second cancel (a cancel
            # request and an interrupt, or shutdown) landing on that await must not skip it
            # (a slot held forever would starve the shard's other drivers).
            renewer.cancel()
            self._admission.leave(workflow_id)
            self._fences.pop(workflow_id, None)
            self._progress.pop(workflow_id, None)
            self._patterns.forget(workflow_id)
            self._knows_ending.discard(workflow_id)
            try:
                await cancel_and_wait([renewer])
            finally:
                with contextlib.suppress(Exception):
                    # Shielded: a cancelled driver (shutdown) still hands its claim back.
                    await asyncio.shield(self._claims.release(fence))

    async def _renew(self, fence: Fence, driver: asyncio.Task[None]) -> None:
        """Keep the claim while driving. Lost (taken over), or not renewed before it
        expired (the database unreachable meanwhile): stop the driver, which may no longer
        be the only one."""
        ttl = self._claims.ttl_ms / 1000
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self._claims.renew(fence)
                renewed = time.monotonic()
            except StaleClaim:
                if self._fences.get(fence.key) is not fence:
                    return  # the driver's last transaction released it: not a takeover
                log.warning("workflow %s: claim taken over; stopping its driver", fence.key)
                driver.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - the database away: retry until expiry
                log.warning("workflow %s: renewing its claim failed (%r)", fence.key, exc)
                if time.monotonic() - renewed >= ttl * 0.9:
                    driver.cancel()
                    return

    async def _drive_with_retries(self, workflow_id: str, fence: Fence) -> None:
        attempts = self._settings.workflow_retry_attempts
        failures, progress = 0, 0
        while True:
            try:
                await self._drive(workflow_id, fence)
                return
            except (asyncio.CancelledError, StaleClaim, _Drained, _Parked):
                raise
            except Exception as exc:
                now = self._progress.get(workflow_id, 0)
                failures, progress = (1, now) if now > progress else (failures + 1, progress)
                if failures >= attempts:
                    await self._give_up(workflow_id, fence, exc, failures)
                    return
                delay = self._retry_backoff.delay(failures)
                log.warning(
                    "workflow %s: infrastructure failure %d/%d (%r); retrying in %.0f ms",
                    workflow_id,
                    failures,
                    attempts,
                    exc,
                    delay * 1000,
                    exc_info=exc,
                )
                async with self._admission.away(workflow_id):
                    await asyncio.sleep(delay)

    async def _give_up(self, workflow_id: str, fence: Fence, exc: Exception, n: int) -> None:
        reason = f"infrastructure failure, {n} attempts in a row: {exc!r}"[:2000]
        log.error("workflow %s: failing it: %s", workflow_id, reason)
        await self._admission.enter(workflow_id)
        record = await self._store.load(workflow_id)
        if record is None or record.finished:
            return
        if record.ending is None:
            ended = await self._store.begin_ending(workflow_id, "failed", reason, fence=fence)
            if ended is None:
                return
            try:
                await self._compensate(ended, fence)
                return
            except (asyncio.CancelledError, StaleClaim):
                raise
            except Exception as again:  # noqa: BLE001 - compensation failed the same way
                reason = f"{reason}; compensation did not complete: {again!r}"[:2000]
        await self._finish(workflow_id, WorkflowState.FAILED, error=reason, step=None, fence=fence)
