"""Fair admission across tenants (issue 29): the slots, the per-tenant ceiling, the order in
which waiters get a slot (a tenant with nothing running first, then round-robin, FIFO within
a tenant), cancellation leaving the queue at once, and close() refusing the waiters."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.runtime.fair_queue import FairAdmission, tenant_ceiling


class Draining(Exception):
    pass


async def _settle() -> None:
    """Let every task that can run do so (the admission never awaits anything else)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Log:
    """Tasks that take a slot, record when they got it, and hold it until released."""

    def __init__(self, admission: FairAdmission) -> None:
        self.admission = admission
        self.started: list[str] = []
        self._hold: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def submit(self, tenant: str, name: str) -> asyncio.Task[None]:
        hold = self._hold[name] = asyncio.Event()

        async def run() -> None:
            async with self.admission.slot(tenant):
                self.started.append(name)
                await hold.wait()

        task = self.tasks[name] = asyncio.create_task(run(), name=name)
        return task

    async def finish(self, name: str) -> None:
        self._hold[name].set()
        await self.tasks[name]
        await _settle()


def test_tenant_ceiling_is_a_share_of_the_slots_and_at_least_one() -> None:
    assert tenant_ceiling(256, 0.5) == 128
    assert tenant_ceiling(4, 0.5) == 2
    assert tenant_ceiling(3, 0.1) == 1
    assert tenant_ceiling(4, 1.0) == 4


async def test_one_tenant_alone_never_holds_every_slot() -> None:
    admission = FairAdmission(slots=4, per_tenant=2)
    log = Log(admission)
    for i in range(6):
        log.submit("a", f"a{i}")
    await _settle()
    assert log.started == ["a0", "a1"]
    assert (admission.running, admission.queued) == (2, 4)
    assert (admission.running_of("a"), admission.queued_of("a")) == (2, 4)
    # Another tenant starts at once on a free slot, behind nobody.
    log.submit("b", "b0")
    await _settle()
    assert log.started == ["a0", "a1", "b0"]
    for name in ("a0", "a1", "b0"):
        await log.finish(name)
    assert log.started[3:] == ["a2", "a3"]


async def test_fifo_within_a_tenant() -> None:
    admission = FairAdmission(slots=1, per_tenant=1)
    log = Log(admission)
    for i in range(5):
        log.submit("a", f"a{i}")
    await _settle()
    for i in range(4):
        await log.finish(f"a{i}")
    assert log.started == ["a0", "a1", "a2", "a3", "a4"]


async def test_waiting_tenants_take_turns() -> None:
    """Full slots, three tenants with backlogs: each release goes to the next tenant in turn,
    whatever the length of each backlog."""
    admission = FairAdmission(slots=1, per_tenant=1)
    log = Log(admission)
    log.submit("x", "x0")
    await _settle()
    for i in range(4):
        log.submit("a", f"a{i}")
    log.submit("b", "b0")
    log.submit("b", "b1")
    log.submit("c", "c0")
    await _settle()
    order = ["x0"]
    while len(log.started) < 8:
        await log.finish(log.started[-1])
        order = log.started
    assert order == ["x0", "a0", "b0", "c0", "a1", "b1", "a2", "a3"]


async def test_a_tenant_with_nothing_running_goes_before_one_under_its_ceiling() -> None:
    """Slots full of A's and C's tasks, both with backlogs; B arrives last: the first slot
    freed goes to B (nothing running), not to A (one running) though A waited longer."""
    admission = FairAdmission(slots=4, per_tenant=2)
    log = Log(admission)
    for i in range(4):
        log.submit("a", f"a{i}")
        log.submit("c", f"c{i}")
    await _settle()
    assert sorted(log.started) == ["a0", "a1", "c0", "c1"]
    log.submit("b", "b0")
    await _settle()
    assert admission.queued == 5
    await log.finish("a0")
    assert log.started[-1] == "b0"


async def test_a_cancelled_waiter_leaves_the_queue_at_once() -> None:
    admission = FairAdmission(slots=1, per_tenant=1)
    log = Log(admission)
    log.submit("a", "a0")
    log.submit("a", "a1")
    log.submit("b", "b0")
    await _settle()
    assert admission.queued == 2
    log.tasks["a1"].cancel()
    await _settle()
    # Gone from the counts before any slot is freed.
    assert (admission.queued, admission.queued_of("a")) == (1, 0)
    with pytest.raises(asyncio.CancelledError):
        await log.tasks["a1"]
    await log.finish("a0")
    assert log.started == ["a0", "b0"]
    await log.finish("b0")
    assert (admission.running, admission.queued) == (0, 0)


async def test_a_waiter_cancelled_before_its_grant_is_seen_is_skipped() -> None:
    """Cancelled and granted in the same turn of the loop: the slot goes to the next one."""
    admission = FairAdmission(slots=1, per_tenant=1)
    log = Log(admission)
    log.submit("a", "a0")
    log.submit("b", "b0")
    log.submit("c", "c0")
    await _settle()
    log.tasks["b0"].cancel()  # not yet run: its future is cancelled, it is still queued
    log._hold["a0"].set()
    await log.tasks["a0"]
    await _settle()
    assert log.started == ["a0", "c0"]
    assert (admission.running, admission.queued) == (1, 0)


async def test_a_grant_to_a_task_cancelled_before_it_resumed_is_given_back() -> None:
    admission = FairAdmission(slots=1, per_tenant=1)
    await admission.acquire("a")
    b = asyncio.create_task(admission.acquire("b"))
    c = asyncio.create_task(admission.acquire("c"))
    await _settle()
    admission.release("a")  # b's grant: b has not resumed yet
    assert admission.running_of("b") == 1
    b.cancel()
    await _settle()
    assert b.cancelled()
    # b gave its slot back, and it went to c.
    assert c.done() and admission.running_of("c") == 1
    assert (admission.running, admission.queued, admission.running_of("b")) == (1, 0, 0)
    admission.release("c")
    assert admission.running == 0


async def test_close_refuses_the_waiters_and_later_arrivals_and_keeps_the_running() -> None:
    admission = FairAdmission(slots=1, per_tenant=1)
    log = Log(admission)
    log.submit("a", "a0")
    log.submit("a", "a1")
    log.submit("b", "b0")
    await _settle()
    admission.close(lambda: Draining("draining"))
    await _settle()
    for name in ("a1", "b0"):
        with pytest.raises(Draining):
            await log.tasks[name]
    assert (admission.running, admission.queued) == (1, 0)
    with pytest.raises(Draining):
        await admission.acquire("c")
    await log.finish("a0")
    assert log.started == ["a0"] and admission.running == 0


async def test_idle_once_a_cancelled_grant_gives_back_the_last_slot() -> None:
    """A drain waits for idle: the last slot, given back by a waiter cancelled between its
    grant and its resumption (no task's `finally` runs for it), still ends the wait."""
    admission = FairAdmission(slots=1, per_tenant=1)
    await admission.acquire("a")
    b = asyncio.create_task(admission.acquire("b"))
    await _settle()
    idle = asyncio.create_task(admission.wait_idle())
    await _settle()
    assert not idle.done()  # a runs, b waits
    admission.release("a")  # b's grant: b has not resumed yet
    b.cancel()
    await asyncio.wait_for(idle, 5)
    assert b.cancelled() and (admission.running, admission.queued) == (0, 0)


async def test_acquire_says_whether_it_waited() -> None:
    """The caller learns from the admission itself whether it waited (a driver that waited
    reads its workflow again), not from a guess made before."""
    admission = FairAdmission(slots=1, per_tenant=1)
    assert await admission.acquire("a") is False  # a free slot: at once
    waiting = asyncio.create_task(admission.acquire("b"))
    await _settle()
    assert not waiting.done()
    admission.release("a")
    assert await asyncio.wait_for(waiting, 1) is True
    admission.release("b")
    assert await admission.acquire("b") is False
    admission.release("b")
    assert admission.running == 0 and admission.queued == 0
