"""At most once per workflow step attempt across the Ray hop (issue 16, item 1): the
dispatcher sends a task to another worker only when the first refused it before starting
(draining); a worker that failed mid-task may have run the attempt's tool calls, so the
attempt is not sent again (the engine retries the step as a new attempt).

The workers here are real Ray actors under the generation's names that stand in for
AgentWorker at the protocol level (the dispatcher's `run` call and its errors), counting
what they were asked to run; AgentWorker's own refusal is the same `WorkerDraining`."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import ray

from actors import NAMESPACE, Generation
from actors.agent_worker import KIND, AttemptLost, RayDispatcher, WorkerDraining
from orchestrator.agents import AgentTask, TaskResult
from orchestrator.auth import Principal
from orchestrator.config import Settings
from orchestrator.db import Database, connect
from orchestrator.events import EventQuery, EventStore


@ray.remote(num_cpus=0)
class StandIn:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.ran: list[str] = []

    def run(self, task: AgentTask) -> TaskResult:
        if self.behaviour == "draining":
            raise WorkerDraining("draining")
        self.ran.append(task.task_id)
        if self.behaviour == "fails-mid-task":
            raise RuntimeError("database went away after the tool call")
        if self.behaviour == "dies-mid-task":
            os._exit(1)
        return TaskResult(task.task_id, "completed", "ok", None, 1, "stand-in")

    def calls(self) -> list[str]:
        return self.ran


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await connect(database_url)
    yield database
    await database.close()


def _workers(generation: Generation, *behaviours: str) -> list[Any]:
    return [
        StandIn.options(name=generation.name(KIND, i), namespace=NAMESPACE).remote(b)  # type: ignore[attr-defined]
        for i, b in enumerate(behaviours)
    ]


def _task(name: str, *, workflow: bool) -> AgentTask:
    return AgentTask(
        task_id=name,
        user_uuid="alice",
        prompt="p",
        workflow_id="wf-1" if workflow else None,
        step="s" if workflow else None,
        idempotency_key=f"wf-1:s:{name}" if workflow else None,
        announced=True,
    )


async def test_an_attempt_failing_mid_task_is_not_sent_again(cluster: None, db: Database) -> None:
    generation = Generation("attempts", "f" * 16)
    workers = _workers(generation, "fails-mid-task", "succeeds")
    dispatcher = RayDispatcher(Settings(agent_workers=2), EventStore(db.pool), generation)
    with pytest.raises(AttemptLost):
        await dispatcher.run(_task("t-1", workflow=True))
    ran = [await w.calls.remote() for w in workers]
    assert ran == [["t-1"], []]  # ran once, on the first worker only
    for w in workers:
        ray.kill(w)


async def test_a_refusal_before_starting_goes_to_another_worker(
    cluster: None, db: Database
) -> None:
    generation = Generation("attempts", "e" * 16)
    workers = _workers(generation, "draining", "succeeds")
    dispatcher = RayDispatcher(Settings(agent_workers=2), EventStore(db.pool), generation)
    result = await dispatcher.run(_task("t-2", workflow=True))
    assert result.status == "completed"
    assert [await w.calls.remote() for w in workers] == [[], ["t-2"]]
    for w in workers:
        ray.kill(w)


async def test_a_plain_task_failing_mid_task_runs_elsewhere(cluster: None, db: Database) -> None:
    """Not a workflow attempt (no idempotency key): the task is sent to another worker."""
    generation = Generation("attempts", "d" * 16)
    workers = _workers(generation, "fails-mid-task", "succeeds")
    dispatcher = RayDispatcher(Settings(agent_workers=2), EventStore(db.pool), generation)
    result = await dispatcher.run(_task("t-3", workflow=False))
    assert result.status == "completed"
    assert [await w.calls.remote() for w in workers] == [["t-3"], ["t-3"]]
    for w in workers:
        ray.kill(w)


async def test_a_worker_dying_mid_task_records_the_task_lost_and_runs_it_elsewhere(
    cluster: None, db: Database
) -> None:
    generation = Generation("attempts", "c" * 16)
    workers = _workers(generation, "dies-mid-task", "succeeds")
    events = EventStore(db.pool)
    dispatcher = RayDispatcher(Settings(agent_workers=2), events, generation)
    result = await dispatcher.run(_task("t-4", workflow=False))
    assert result.status == "completed"
    assert await workers[1].calls.remote() == ["t-4"]
    lost, _ = await events.query(
        EventQuery(aggregate="t-4", types=("worker.task_failed",)), Principal("admin", True)
    )
    assert [(e.data["worker_id"], e.user_uuid) for e in lost] == [("agent-worker-0", "alice")]
    assert "died while running it" in lost[0].data["error"]
    for w in workers:
        ray.kill(w)


async def test_a_task_waits_for_a_pool_that_is_not_running_yet(cluster: None, db: Database) -> None:
    """No worker of the generation is running (its node was lost and the pool is restarting
    elsewhere): the task, not sent yet, waits for one instead of failing after a few quick
    lookups (that failed a workflow step for want of a process, tests/e2e/test_multinode.py)."""
    generation = Generation("attempts", "d" * 16)
    dispatcher = RayDispatcher(Settings(agent_workers=2), EventStore(db.pool), generation)
    pending = asyncio.ensure_future(dispatcher.run(_task("t-5", workflow=True)))
    # Past the four lookups that used to be all (0.5 + 1 + 2 s of backoff, jittered).
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        assert not pending.done(), pending.result()
        await asyncio.sleep(0.1)
    workers = _workers(generation, "succeeds", "succeeds")
    result = await asyncio.wait_for(pending, 30)
    assert result.status == "completed"
    ran = [task_id for w in workers for task_id in await w.calls.remote()]
    assert ran == ["t-5"]
    for w in workers:
        ray.kill(w)
