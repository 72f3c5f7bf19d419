"""Fair admission of a shard's workflow drivers to its database (issue 29).

A shard's drivers share one small Postgres pool (8 connections, actors/workflow_shard.py),
and asyncpg serves waiting callers first come, first served: without admission, a tenant
with hundreds of workflows in flight puts hundreds of transactions ahead of another tenant's
one-step workflow. So a driver does its database work (its step transitions, compensation,
giving up) only while it holds one of `workflow_shard_max_active` slots, at most
`workflow_shard_tenant_share` of them for one tenant (the workflow's user_uuid). A freed
slot goes to the waiting tenant with the fewest drivers in, ties round-robin: the
AgentWorkers' admission (orchestrator/runtime/fair_queue.py). A driver gives its slot up
while it waits on anything else: its agent task, its children, a retry's backoff.

Not admitted: a driver's first read (its claim and the workflow's row: until then it does
not know the tenant), claim renewals (a renewal queued behind work could lose the claim),
the sweep, the listener, cancel requests and the claim's release at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from orchestrator.runtime.fair_queue import FairAdmission, tenant_ceiling

__all__ = ["DriverAdmission"]


class DriverAdmission:
    """Slots for workflow drivers, by workflow id: `enter` before database work, `away`
    around a wait on something else, `leave` when the driver ends. One event loop, no
    locks: nothing awaits between reading and changing the holdings."""

    def __init__(self, slots: int, share: float) -> None:
        self._fair = FairAdmission(slots, tenant_ceiling(slots, share))
        self._tenants: dict[str, str] = {}  # workflow id -> its user, once its driver knows
        self._holding: set[str] = set()

    def __repr__(self) -> str:
        return repr(self._fair)

    @property
    def running(self) -> int:
        return self._fair.running

    @property
    def queued(self) -> int:
        return self._fair.queued

    async def enter(self, workflow_id: str, tenant: str | None = None) -> bool:
        """Hold a slot for the workflow's driver: at once when it holds one already, or
        its tenant is not known yet (`tenant` is remembered from the first call that gives
        it). True when it had to wait for the slot (what it read before may be old)."""
        if tenant is not None:
            self._tenants[workflow_id] = tenant
        known = self._tenants.get(workflow_id)
        if known is None or workflow_id in self._holding:
            return False
        waited = await self._fair.acquire(known)  # cancelled while waiting: leaves the queue
        self._holding.add(workflow_id)
        return waited

    @asynccontextmanager
    async def away(self, workflow_id: str) -> AsyncIterator[None]:
        """The block runs without the slot, which is taken again after it (not after an
        exception: the code handling that enters before its database work)."""
        held = self._drop(workflow_id)
        yield
        if held:
            await self.enter(workflow_id)

    def leave(self, workflow_id: str) -> None:
        """The driver ended (however): its slot, if held, goes to the next waiter."""
        self._drop(workflow_id)
        self._tenants.pop(workflow_id, None)

    def _drop(self, workflow_id: str) -> bool:
        if workflow_id not in self._holding:
            return False
        self._holding.discard(workflow_id)
        self._fair.release(self._tenants[workflow_id])
        return True
