"""Fair admission in a real AgentWorker (issue 29): one tenant's flood of slow agent tasks
holds at most its share of the worker's slots, the rest wait in its queue, and another
tenant's task starts at once, while every one of the flood is still unfinished. A cancelled
caller's waiting task leaves the queue; a drain refuses the waiting ones (WorkerDraining)
and keeps the running ones.

Real local Ray, the AgentWorker actor created with the options the generation gives it,
tasks sent through RayDispatcher, the real database; the model is a loopback OpenAI-format
server whose replies to the flood take a minute (`[sleep 60]`), so the order in which tasks
reach it is the order in which the worker started them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import ray

from actors import NAMESPACE, Generation
from actors.agent_worker import KIND, RayDispatcher
from actors.generation import members
from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import connect
from orchestrator.events import EventStore
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings

T = TypeVar("T")
FLOOD = 6


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


async def _polled(probe: Callable[[], Awaitable[T]], within: float = 60.0) -> T:
    """The probe's first truthy answer (the state lives in the worker's process)."""
    deadline = time.monotonic() + within
    while not (found := await probe()):
        assert time.monotonic() < deadline, "not observed in time"
        await asyncio.sleep(0.05)
    return found


def _seen(llm: OpenAIFake) -> list[str]:
    """The tasks (by prompt) whose model calls reached the upstream, in arrival order."""
    return [task_prompt(r.json).split()[-1] for r in llm.chat_requests]


def _task(user: str, name: str, prompt: str) -> AgentTask:
    return AgentTask(task_id=f"t-{name}", user_uuid=user, prompt=prompt)


async def test_a_tenants_flood_holds_its_share_and_another_tenant_starts_at_once(
    cluster: None, make_settings: Any, llm: OpenAIFake
) -> None:
    settings = agent_settings(
        make_settings,
        llm,
        agent_workers=1,
        agent_worker_max_running=4,
        agent_worker_tenant_share=0.5,
    )
    generation = Generation.of("admission", settings)
    (member,) = [m for m in members(settings, generation) if m.kind == KIND]
    worker = member.actor_class.options(
        name=member.name, namespace=NAMESPACE, **member.options
    ).remote(*member.args)
    db = await connect(settings.database_url or "")
    dispatcher = RayDispatcher(settings, EventStore(db.pool), generation)
    flood: dict[str, asyncio.Task[TaskResult]] = {}
    try:
        await worker.ready.remote()
        for i in range(FLOOD):
            name = f"a{i}"
            flood[name] = asyncio.create_task(
                dispatcher.run(_task("tenant-a", name, f"[sleep 60] {name}"))
            )
        # Tenant A's first tasks reach the model: two of them (its share of four slots).
        await _polled(lambda: _reached(llm, 2))
        b = await asyncio.wait_for(dispatcher.run(_task("tenant-b", "b0", "b0")), 60)
        assert b.status == "completed", b
        assert not any(t.done() for t in flood.values())
        seen = _seen(llm)
        # A never held more than its share; B went straight to a free slot.
        assert len([s for s in seen if s.startswith("a")]) == 2, seen
        assert seen[2] == "b0", seen
        load = await worker.load.remote()
        assert (load["running"], load["queued"]) == (2, FLOOD - 2), load

        # A cancelled caller's waiting task leaves the queue (the running ones stay).
        waiting = [n for n in flood if n not in seen]
        for name in waiting[:2]:
            flood[name].cancel()
        await _polled(lambda: _load_is(worker, running=2, queued=FLOOD - 4))

        # A drain refuses what still waits (the dispatcher hears WorkerDraining and, with no
        # other worker, gives up) and waits for the running ones.
        drained = worker.drain.remote()
        for name in waiting[2:]:
            refused = await asyncio.wait_for(flood[name], 60)
            assert refused.status == "failed" and "draining" in (refused.error or ""), refused
        assert (await worker.load.remote())["running"] == 2
        for name in flood:
            flood[name].cancel()
        await asyncio.wait_for(drained, 60)
        assert await _load_is(worker, running=0, queued=0)
        # None of the cancelled or refused tasks reached the model.
        assert sorted(_seen(llm)) == sorted([*seen[:2], "b0"])
    finally:
        for task in flood.values():
            task.cancel()
        await asyncio.gather(*flood.values(), return_exceptions=True)
        ray.kill(worker)
        await db.close()


async def _reached(llm: OpenAIFake, n: int) -> bool:
    return len(_seen(llm)) >= n


async def _load_is(worker: Any, *, running: int, queued: int) -> bool:
    load = await worker.load.remote()
    return bool(load["running"] == running and load["queued"] == queued)
