"""Fenced ownership of workflows (issue 16, items 1, 3 and 5), against real Postgres with
engines in this process standing in for shards: a stale epoch's write is rejected, a zombie
driver and a re-sharding never execute a step twice, infrastructure failures end in a
failed workflow with the reason, and a parent wakes on its children's NOTIFY."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.runtime.claims import ClaimStore, StaleClaim
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from tests.conftest import make_supervisor


class _Agent:
    """Agent work with a side effect per call. A task whose id is in `gates` waits for
    its gate; `effects` counts calls that ran to the end (the tool's side effect),
    `dispatched` every call, by task id."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.dispatched: collections.Counter[str] = collections.Counter()
        self.effects: collections.Counter[str] = collections.Counter()
        self.milestones: list[tuple[int, asyncio.Event]] = []

    def after(self, effects: int) -> asyncio.Event:
        """Set once `effects` side effects have happened."""
        event = asyncio.Event()
        self.milestones.append((effects, event))
        return event

    async def run(self, task: AgentTask) -> TaskResult:
        self.dispatched[task.task_id] += 1
        self.started[task.task_id].set()
        gate = self.gates.get(task.task_id)
        if gate is not None:
            await gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        self.effects[task.task_id] += 1
        for n, event in self.milestones:
            if sum(self.effects.values()) >= n:
                event.set()
        return TaskResult(task.task_id, "completed", f"done {task.step}", None, 1, "test")


class _Broken:
    """Infrastructure that fails every time (the worker pool unreachable)."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, task: AgentTask) -> TaskResult:
        self.calls += 1
        raise ConnectionError("no agent worker reachable")


@pytest.fixture
async def db(make_settings: Any) -> AsyncIterator[Database]:
    settings = make_settings()
    database = await connect(settings.database_url)
    yield database
    await database.close()


def _store(db: Database) -> WorkflowStore:
    return WorkflowStore(db.pool, EventStore(db.pool))


def _spec(name: str, steps: int) -> WorkflowSpec:
    return WorkflowSpec.parse(name, [{"name": f"s{i}", "prompt": f"p{i}"} for i in range(steps)])


async def _completions(db: Database, workflow_id: str) -> collections.Counter[str]:
    rows = await db.pool.fetch(
        "SELECT data->>'step' AS step FROM events WHERE type = 'workflow.step_completed'"
        " AND data->>'workflow_id' = $1",
        workflow_id,
    )
    return collections.Counter(r["step"] for r in rows)


def _per_step(counter: collections.Counter[str]) -> collections.Counter[str]:
    """Task ids `<wf>:<step>:<attempt>` counted per `<wf>:<step>`."""
    out: collections.Counter[str] = collections.Counter()
    for task_id, n in counter.items():
        out[task_id.rsplit(":", 1)[0]] += n
    return out


async def test_a_stale_epochs_write_is_rejected(db: Database) -> None:
    store = _store(db)
    claims = ClaimStore(db.pool, ttl_ms=60_000)
    wid = await store.create(_spec("w", 1), "ann")
    old = await claims.acquire("workflow", wid, "shard-0/gen-a")
    assert old is not None
    assert await claims.acquire("workflow", wid, "shard-1/gen-b") is None  # held: no
    # gen-a stops renewing (a zombie): its claim expires and gen-b takes over.
    await db.pool.execute("UPDATE claims SET expires_at = 0 WHERE key = $1", wid)
    new = await claims.acquire("workflow", wid, "shard-1/gen-b")
    assert new is not None and new.epoch > old.epoch
    with pytest.raises(StaleClaim):
        await store.mark_started(wid, old)
    with pytest.raises(StaleClaim):
        await store.start_step(wid, 0, fence=old)
    with pytest.raises(StaleClaim):
        await claims.renew(old)
    record = await store.load(wid)
    assert record is not None and str(record.status) == "pending"
    assert record.steps[0].attempt == 0  # nothing of the zombie's was written
    await claims.release(old)  # a stale release is a no-op
    assert await claims.holder("workflow", wid) == ("shard-1/gen-b", new.epoch, True)
    await store.mark_started(wid, new)
    await claims.release(new)
    again = await claims.acquire("workflow", wid, "shard-0/gen-a")
    assert again is not None and again.epoch > new.epoch  # epochs only grow


async def test_two_engines_over_one_workflow_run_each_step_once(
    make_settings: Any, db: Database
) -> None:
    """Two shard generations asked to drive the same workflows: one drives, the other
    finds the claim taken. Then the driver turns zombie (its claim expires mid-step): the
    other takes over, and the zombie's late result and any further dispatch are refused."""
    settings = make_settings(workflow_claim_ttl_ms=60_000)
    store = _store(db)
    agent = _Agent()
    old = WorkflowEngine(
        store, agent, settings, owner="shard-0/gen-a", supervisor=make_supervisor()
    )
    new = WorkflowEngine(
        store, agent, settings, owner="shard-0/gen-b", supervisor=make_supervisor()
    )
    try:
        wids = [await store.create(_spec(f"w{i}", 3), "ann") for i in range(4)]
        gated = f"{wids[0]}:s1:1"
        agent.gates[gated] = asyncio.Event()
        for wid in wids:
            await old.start(wid)
            await new.start(wid)
        await asyncio.wait_for(agent.started[gated].wait(), 20)
        for wid in wids[1:]:
            await old.wait(wid, within=30)
        # The old driver of wids[0] is stuck in step s1 (a paused process): its claim runs out.
        await db.pool.execute("UPDATE claims SET expires_at = 0 WHERE key = $1", wids[0])
        assert await new.sweep() == 1
        await asyncio.wait_for(agent.started[f"{wids[0]}:s1:2"].wait(), 20)
        agent.gates[gated].set()  # the zombie's step ends now: its result must not count
        final = await new.wait(wids[0], within=30)
        assert str(final.status) == "completed"
        for wid in wids:
            assert await _completions(db, wid) == {"s0": 1, "s1": 1, "s2": 1}, wid
        # Every attempt was dispatched once; only the zombie's step ran twice (two attempts).
        assert set(agent.dispatched.values()) == {1}
        per_step = _per_step(agent.dispatched)
        assert {k: v for k, v in per_step.items() if v != 1} == {f"{wids[0]}:s1": 2}
        rows = await db.pool.fetch(
            "SELECT step, idempotency_key FROM workflow_step_results WHERE workflow_id = $1",
            wids[0],
        )
        assert sorted(r["idempotency_key"] for r in rows) == [
            f"{wids[0]}:s0:1",
            f"{wids[0]}:s1:2",
            f"{wids[0]}:s2:1",
        ]
    finally:
        await old.shutdown()
        await new.shutdown()


async def test_resharding_mid_run_loses_and_duplicates_nothing(
    make_settings: Any, db: Database
) -> None:
    """Shards of `workflow_shards=2` drive 12 workflows; shards of a `workflow_shards=3`
    layout start meanwhile (the old ones still alive: a redeploy) and resume; then the old
    ones stop. Every workflow completes, every step once, no tool side effect twice."""
    settings = make_settings(workflow_claim_ttl_ms=60_000)
    store = _store(db)
    agent = _Agent(delay=0.3)
    old = [
        WorkflowEngine(store, agent, settings, owner=f"shard-{i}/2", supervisor=make_supervisor())
        for i in range(2)
    ]
    new = [
        WorkflowEngine(store, agent, settings, owner=f"shard-{i}/3", supervisor=make_supervisor())
        for i in range(3)
    ]
    try:
        wids = [await store.create(_spec(f"w{i}", 4), "ann") for i in range(12)]
        mid_run = agent.after(8)
        for i, engine in enumerate(old):
            await engine.resume_unfinished(i, 2)
        await asyncio.wait_for(mid_run.wait(), 30)
        for i, engine in enumerate(new):
            await engine.resume_unfinished(i, 3)
        for engine in old:
            # A drain (a redeploy): the step in flight is recorded, then the claims go back.
            await engine.shutdown(drain_s=30)
        for i, engine in enumerate(new):
            await engine.resume_unfinished(i, 3)
        for wid in wids:
            assert str((await new[0].wait(wid, within=60)).status) == "completed"
            assert await _completions(db, wid) == {"s0": 1, "s1": 1, "s2": 1, "s3": 1}
        effects = _per_step(agent.effects)
        assert len(effects) == 12 * 4
        assert set(effects.values()) == {1}, {k: v for k, v in effects.items() if v != 1}
    finally:
        for engine in old + new:
            await engine.shutdown()


async def test_infrastructure_failures_end_in_a_failed_workflow(
    make_settings: Any, db: Database
) -> None:
    settings = make_settings(
        workflow_retry_attempts=3, workflow_retry_base_ms=20, workflow_retry_max_ms=50
    )
    store = _store(db)
    broken = _Broken()
    engine = WorkflowEngine(store, broken, settings, supervisor=make_supervisor())
    try:
        wid = await store.create(_spec("w", 2), "ann")
        await engine.start(wid)
        final = await engine.wait(wid, within=30)
        assert str(final.status) == "failed"
        assert final.error is not None
        assert final.error.startswith("infrastructure failure, 3 attempts in a row")
        assert "no agent worker reachable" in final.error
        assert broken.calls == 3
        failed = await db.pool.fetchval(
            "SELECT data FROM events WHERE type = 'workflow.failed' AND data->>'workflow_id' = $1",
            wid,
        )
        assert "infrastructure failure" in json.loads(failed)["error"]
        # Its claim went with it: nothing is left to drive.
        assert await engine.claims.holder("workflow", wid) is None
    finally:
        await engine.shutdown()


async def test_a_parent_wakes_on_its_childrens_notify(
    make_settings: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's end reaches the parent as `NOTIFY orch_workflows 'done:<child>'`; with
    the safety re-check pushed out to an hour, the parent still completes at once."""
    import orchestrator.workflows._engine as engine_module

    monkeypatch.setattr(engine_module, "CHILD_RECHECK_S", 3600.0)
    settings = make_settings()
    store = _store(db)
    heard: list[str] = []
    listener = await asyncpg.connect(settings.database_url)
    await listener.add_listener("orch_workflows", lambda *a: heard.append(a[-1]))
    engine = WorkflowEngine(store, _Agent(delay=0.2), settings, supervisor=make_supervisor())
    try:
        spec = WorkflowSpec.parse(
            "parent",
            [
                {
                    "name": "fan",
                    "type": "spawn",
                    "workflows": [
                        {"name": f"child{i}", "steps": [{"name": "s", "prompt": "x"}]}
                        for i in range(3)
                    ],
                },
                {"name": "after", "prompt": "y"},
            ],
        )
        pid = await store.create(spec, "ann")
        await engine.start(pid)
        final = await engine.wait(pid, within=30)
        assert str(final.status) == "completed"
        children = await store.children(pid)
        assert len(children) == 3 and all(str(c.status) == "completed" for c in children)
        assert {f"done:{c.id}" for c in children} | {f"done:{pid}"} <= set(heard)
        summary = json.loads(final.steps[0].result or "{}")["children"]
        assert [c["id"] for c in summary] == [c.id for c in children]
    finally:
        await engine.shutdown()
        await listener.close()


async def test_a_restarted_shard_takes_its_claims_back_at_once(
    make_settings: Any, db: Database
) -> None:
    """A shard restarted under the same name (its process killed) need not wait for its
    predecessor's claims to expire; the predecessor, were it still running, is fenced."""
    settings = make_settings(workflow_claim_ttl_ms=600_000)
    store = _store(db)
    agent = _Agent()
    first = WorkflowEngine(
        store, agent, settings, owner="gen-a-WorkflowShard-0", supervisor=make_supervisor()
    )
    again = WorkflowEngine(
        store, agent, settings, owner="gen-a-WorkflowShard-0", supervisor=make_supervisor()
    )
    other = WorkflowEngine(
        store, agent, settings, owner="gen-a-WorkflowShard-1", supervisor=make_supervisor()
    )
    try:
        wid = await store.create(_spec("w", 2), "ann")
        gated = f"{wid}:s0:1"
        agent.gates[gated] = asyncio.Event()
        await first.start(wid)
        await asyncio.wait_for(agent.started[gated].wait(), 20)
        assert await other.resume_unfinished(1, 2) == 0  # live claim, another owner: no
        assert await again.resume_unfinished(0, 2) == 1  # its own name: at once
        final = await again.wait(wid, within=30)
        assert str(final.status) == "completed"
        agent.gates[gated].set()  # the predecessor's late result is refused
        await asyncio.sleep(0)
        assert await _completions(db, wid) == {"s0": 1, "s1": 1}
        assert agent.dispatched[f"{wid}:s0:2"] == 1
    finally:
        for engine in (first, again, other):
            await engine.shutdown()


async def test_a_cancel_reaches_the_driver_on_another_engine(
    make_settings: Any, db: Database
) -> None:
    """The cancel lands on an engine that does not drive the workflow (another shard): the
    driver hears `cancel:<id>`, abandons its step and compensates; the cancel answers
    with the final status."""
    settings = make_settings()
    store = _store(db)
    agent = _Agent()
    driver = WorkflowEngine(store, agent, settings, owner="shard-0", supervisor=make_supervisor())
    other = WorkflowEngine(store, agent, settings, owner="shard-1", supervisor=make_supervisor())
    try:
        wid = await store.create(_spec("w", 3), "ann")
        gated = f"{wid}:s1:1"
        agent.gates[gated] = asyncio.Event()  # never opened: only a cancel ends this step
        await driver.start(wid)
        await asyncio.wait_for(agent.started[gated].wait(), 20)
        assert await asyncio.wait_for(other.cancel(wid), 30) == "cancelled"
        final = await store.load(wid)
        assert final is not None
        assert [str(s.status) for s in final.steps] == ["completed", "skipped", "skipped"]
        assert agent.effects[gated] == 0 and f"{wid}:s2:1" not in agent.dispatched
    finally:
        await driver.shutdown()
        await other.shutdown()
