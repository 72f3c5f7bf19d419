"""Fair admission to a bounded number of slots, across tenants (issue 29).

An AgentWorker runs at most `slots` tasks at once. A task that finds them full, or its
tenant at its own ceiling (`per_tenant`), waits in its tenant's FIFO queue. When a slot
frees, it goes to the waiting tenant (under its ceiling) with the fewest tasks running here,
ties to the tenant served least recently: a tenant with nothing running goes first, and
tenants with backlogs take turns (round-robin). So one tenant's backlog delays another
tenant's task by at most one slot release per waiting tenant ahead of it, never by the
length of the backlog; and one tenant alone never holds every slot.

A waiter whose caller is cancelled leaves its queue at once; a slot granted to a waiter
cancelled before it resumed is given back. `close()` refuses every waiter and every later
arrival (the worker drains: nothing that waits has started, so it may run elsewhere);
`wait_idle()` returns once nothing runs and nothing waits (a drain's end), however the last
slot was given back (a release, or a grant whose waiter was cancelled before it resumed).

Plain asyncio, one event loop: no locks, since no method awaits between reading and
changing the counts.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

__all__ = ["FairAdmission", "tenant_ceiling"]


def tenant_ceiling(slots: int, share: float) -> int:
    """Running tasks one tenant may hold of `slots`: `share` of them, at least one."""
    return max(1, min(slots, math.floor(slots * share)))


class FairAdmission:
    """`slots` tasks at once; at most `per_tenant` of them one tenant's; per-tenant FIFO
    queues served fewest-running first, then round-robin."""

    def __init__(self, slots: int, per_tenant: int) -> None:
        if slots < 1 or per_tenant < 1:
            raise ValueError("slots and per_tenant must be at least 1")
        self.slots = slots
        self.per_tenant = min(per_tenant, slots)
        self._running: dict[str, int] = {}
        self._total = 0
        # Tenants with waiters, least recently served first (the round-robin ring).
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._queued = 0
        self._closed: Callable[[], BaseException] | None = None
        # Set when nothing runs and nothing waits: kept here, where every count changes, so
        # no path that frees the last slot (the waiter's own give-back included) misses it.
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        return self._total

    @property
    def queued(self) -> int:
        return self._queued

    async def wait_idle(self) -> None:
        """Return once no task runs and none waits."""
        await self._idle.wait()

    def running_of(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def queued_of(self, tenant: str) -> int:
        return sum(1 for f in self._waiting.get(tenant, ()) if not f.done())

    def __repr__(self) -> str:
        return (
            f"FairAdmission(running={self._total}/{self.slots}, queued={self._queued}, "
            f"tenants_waiting={len(self._waiting)})"
        )

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold one of the slots for `tenant` while the block runs."""
        await self.acquire(tenant)
        try:
            yield
        finally:
            self.release(tenant)

    async def acquire(self, tenant: str) -> bool:
        """Wait for a slot (at once when one is free for this tenant and none of its own
        tasks waits ahead); True when it had to wait. Raises what `close()` was given once
        closed."""
        if self._closed is not None:
            raise self._closed()
        if (
            tenant not in self._waiting
            and self._total < self.slots
            and self._running.get(tenant, 0) < self.per_tenant
        ):
            self._start(tenant)
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = deque()  # joins the ring last
        queue.append(waiter)
        self._queued += 1
        self._idle.clear()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Granted, then cancelled before this task resumed: give the slot back.
                self.release(tenant)
            else:
                self._forget(tenant, waiter)
            raise
        return True

    def release(self, tenant: str) -> None:
        """A task of `tenant` ended: its slot goes to the next waiter."""
        held = self._running.get(tenant, 0)
        if held <= 0:
            raise RuntimeError(f"release without a slot held by {tenant!r}")
        if held == 1:
            del self._running[tenant]
        else:
            self._running[tenant] = held - 1
        self._total -= 1
        self._dispatch()
        self._settle()

    def close(self, error: Callable[[], BaseException]) -> None:
        """Refuse every waiter, and every later `acquire`, with `error()`. Running tasks
        keep their slots until they release them."""
        self._closed = error
        waiting, self._waiting = self._waiting, {}
        self._queued = 0
        for queue in waiting.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_exception(error())
        self._settle()

    # --- internals ------------------------------------------------------------------------

    def _start(self, tenant: str) -> None:
        self._running[tenant] = self._running.get(tenant, 0) + 1
        self._total += 1
        self._idle.clear()

    def _settle(self) -> None:
        if self._total == 0 and self._queued == 0:
            self._idle.set()

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        """A cancelled waiter leaves its queue now (not when its turn would have come)."""
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return  # already dropped by `_dispatch` (it skips cancelled waiters)
        self._queued -= 1
        if not queue:
            del self._waiting[tenant]
        self._settle()

    def _pick(self) -> str | None:
        """The waiting tenant under its ceiling with the fewest running here; ties go to the
        one served least recently (first in the ring)."""
        best: str | None = None
        fewest = self.per_tenant
        for tenant in self._waiting:
            running = self._running.get(tenant, 0)
            if running < fewest:
                best, fewest = tenant, running
                if running == 0:
                    break
        return best

    def _dispatch(self) -> None:
        while self._total < self.slots and self._waiting:
            tenant = self._pick()
            if tenant is None:
                return  # every waiting tenant is at its ceiling
            queue = self._waiting[tenant]
            waiter = queue.popleft()
            self._queued -= 1
            del self._waiting[tenant]
            if waiter.done():
                # Its caller was cancelled and has not run yet (`acquire` finds it gone):
                # the tenant keeps its place in the ring.
                if queue:
                    self._waiting = {tenant: queue, **self._waiting}
                continue
            if queue:
                self._waiting[tenant] = queue  # back of the ring: served most recently
            self._start(tenant)
            waiter.set_result(None)
