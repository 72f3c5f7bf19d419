"""A shard's drivers and their database slots (orchestrator/workflows/_admission.py): a
driver holds no slot until it knows its tenant, gives it up while it waits on something
else and queues again after (behind another tenant with nothing in), and gives it back
however it ends, cancelled in the queue included."""

from __future__ import annotations

import asyncio

from orchestrator.workflows._admission import DriverAdmission


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_driver_holds_a_slot_only_once_its_tenant_is_known() -> None:
    admission = DriverAdmission(slots=2, share=0.5)
    assert await admission.enter("wf-1") is False  # the tenant not read yet: nothing held
    assert admission.running == 0
    assert await admission.enter("wf-1", "ann") is False  # a free slot: no wait
    assert await admission.enter("wf-1") is False  # held already
    assert admission.running == 1
    admission.leave("wf-1")
    assert admission.running == 0


async def test_away_gives_the_slot_up_and_another_tenant_goes_first_after() -> None:
    """ann's drivers hold both slots and one more of hers waits; bob's driver arrives.
    When one of ann's goes away to its agent task, bob's gets the slot (ahead of ann's
    queue), and ann's, back from its task, queues behind her own waiting driver."""
    admission = DriverAdmission(slots=2, share=1.0)
    await admission.enter("a1", "ann")
    await admission.enter("a2", "ann")
    order: list[str] = []

    async def driver(wid: str, tenant: str) -> None:
        waited = await admission.enter(wid, tenant)
        order.append(f"{wid} waited={waited}")

    a3 = asyncio.create_task(driver("a3", "ann"))
    await _settle()
    b1 = asyncio.create_task(driver("b1", "bob"))
    await _settle()
    assert order == [] and admission.queued == 2

    agent_done = asyncio.Event()

    async def a1_step() -> None:
        async with admission.away("a1"):  # waiting on its agent task: no slot
            await agent_done.wait()
        order.append("a1 back")

    back = asyncio.create_task(a1_step())
    await _settle()
    assert order == ["b1 waited=True"]  # bob has nothing running: first
    agent_done.set()
    await _settle()
    assert not back.done() and admission.queued == 2  # a1 waits behind a3
    admission.leave("a2")
    await _settle()
    assert order == ["b1 waited=True", "a3 waited=True"]
    admission.leave("b1")
    await asyncio.wait_for(back, 1)
    assert order[-1] == "a1 back" and admission.running == 2  # a1 holds a slot again
    for wid in ("a1", "a3"):
        admission.leave(wid)
    await asyncio.gather(a3, b1)
    assert admission.running == 0 and admission.queued == 0


async def test_an_exception_while_away_does_not_take_the_slot_again() -> None:
    admission = DriverAdmission(slots=1, share=1.0)
    await admission.enter("wf-1", "ann")
    try:
        async with admission.away("wf-1"):
            raise ConnectionError("the agent worker is gone")
    except ConnectionError:
        pass
    assert admission.running == 0
    await admission.enter("wf-1")  # the retry enters again, the tenant remembered
    assert admission.running == 1
    admission.leave("wf-1")
    admission.leave("wf-1")  # twice: nothing more released
    assert admission.running == 0


async def test_a_driver_cancelled_in_the_queue_leaves_it() -> None:
    admission = DriverAdmission(slots=1, share=1.0)
    await admission.enter("wf-1", "ann")
    waiting = asyncio.create_task(admission.enter("wf-2", "bob"))
    await _settle()
    assert admission.queued == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    admission.leave("wf-2")  # the driver's `finally`: it held nothing
    assert admission.queued == 0 and admission.running == 1
    admission.leave("wf-1")
    assert admission.running == 0


async def test_enter_reports_the_wait_the_admission_saw() -> None:
    admission = DriverAdmission(slots=1, share=1.0)
    assert await admission.enter("wf-1", "ann") is False
    second = asyncio.create_task(admission.enter("wf-2", "bob"))
    await _settle()
    admission.leave("wf-1")
    assert await asyncio.wait_for(second, 1) is True
    admission.leave("wf-2")
    assert admission.running == 0 and admission.queued == 0
