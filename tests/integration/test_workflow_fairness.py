"""Fairness across tenants on a workflow shard (issue 29), against real Postgres with an
engine over a shard-sized pool: one tenant's backlog of step transitions does not queue
another tenant's workflow behind it (the drivers' database work is admitted per tenant),
and the recovery sweep takes unclaimed workflows round-robin by tenant, not oldest first.
Also what keeps the shard's slots and connections from leaking: a driver cancelled twice
gives its slot back, the live-ceiling check waits a bounded time for its user's lock, and
a spawn past that ceiling fails its step instead of retrying."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.db import Database, connect
from orchestrator.errors import RateLimited
from orchestrator.events import EventStore
from orchestrator.runtime.claims import ClaimStore, Fence
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from orchestrator.workflows._store import LIVE_LOCK
from tests.conftest import make_supervisor
from tests.integration.test_workflow_claims import _Agent, _spec, _store, db

__all__ = ["db"]  # fixture used here

BACKLOG = 200


@pytest.fixture
async def shard_db(make_settings: Any) -> AsyncIterator[Database]:
    """A pool the size of a WorkflowShard's (actors/workflow_shard.py)."""
    database = await connect(make_settings().database_url, max_size=8)
    yield database
    await database.close()


async def test_a_tenants_backlog_does_not_queue_another_tenants_workflow(
    make_settings: Any, shard_db: Database
) -> None:
    """Tenant A has BACKLOG workflows in flight, each in a step that blocks; all of those
    steps end at once (BACKLOG transitions wanting the shard's 8 connections) just as
    tenant B's one-step workflow arrives. B's workflow completes while A's are all still
    running, and with few of A's transitions committed before it: first come, first served
    it would wait for (nearly) all of them."""
    settings = make_settings(workflow_claim_ttl_ms=120_000, workflow_max_live_per_user=BACKLOG + 10)
    store = WorkflowStore(shard_db.pool, EventStore(shard_db.pool))
    agent = _Agent()
    engine = WorkflowEngine(store, agent, settings, owner="shard-0", supervisor=make_supervisor())
    a_done, a_hold = asyncio.Event(), asyncio.Event()
    try:
        a_ids = [await store.create(_spec(f"a{i}", 2), "tenant-a") for i in range(BACKLOG)]
        for wid in a_ids:
            agent.gates[f"{wid}:s0:1"] = a_done  # all end together
            agent.gates[f"{wid}:s1:1"] = a_hold  # A stays in flight until the end
            await engine.start(wid)
        await asyncio.wait_for(
            asyncio.gather(*(agent.started[f"{w}:s0:1"].wait() for w in a_ids)), 120
        )
        b = await store.create(_spec("b", 1), "tenant-b")
        a_done.set()
        await engine.start(b)
        assert str((await engine.wait(b, within=120)).status) == "completed"

        b_end = await shard_db.pool.fetchval(
            "SELECT position FROM events WHERE type = 'workflow.completed'"
            " AND data->>'workflow_id' = $1",
            b,
        )
        a_before = await shard_db.pool.fetchval(
            "SELECT count(*) FROM events WHERE type = 'workflow.step_completed'"
            " AND user_uuid = 'tenant-a' AND position < $1",
            b_end,
        )
        statuses = await store.statuses(a_ids)
        assert set(statuses.values()) == {"running"}  # every one of A's still in flight
        # Admitted: each of B's few transactions waits for a handful of A's (A holds at most
        # its share of the slots); first come, first served: behind all BACKLOG.
        assert a_before < BACKLOG // 2, (a_before, engine.admission)

        a_hold.set()  # and nothing of A's is lost or repeated on the way
        for wid in a_ids:
            assert str((await engine.wait(wid, within=120)).status) == "completed"
        assert set(agent.dispatched.values()) == {1}
        await _drivers_ended(engine, [*a_ids, b])
        assert engine.admission.running == 0 and engine.admission.queued == 0
    finally:
        a_done.set()
        a_hold.set()
        await engine.shutdown()


async def _drivers_ended(engine: WorkflowEngine, ids: list[str]) -> None:
    """A waiter wakes at the terminal write; the driver gives its slot back just after."""
    drivers = [d for d in (engine._driver(w) for w in ids) if d is not None]
    await asyncio.wait_for(asyncio.gather(*drivers, return_exceptions=True), 30)


def _round_robin(rows: list[tuple[int, str, str]]) -> list[str]:
    """(number, user, id) rows in round-robin order by user: each user's oldest first."""
    turn: dict[str, int] = {}
    ranked = []
    for number, user, wid in sorted(rows):
        turn[user] = turn.get(user, 0) + 1
        ranked.append((turn[user], number, wid))
    return [wid for _, _, wid in sorted(ranked)]


async def test_the_sweep_takes_unclaimed_workflows_round_robin_by_tenant(db: Database) -> None:
    """After a restart, the sweep's batch is not A's oldest backlog: B's and C's newer
    workflows come in its first turns; this shard's own come first all the same."""
    store = _store(db)
    made: list[tuple[str, str]] = []
    for user, n in (("tenant-a", 6), ("tenant-b", 2), ("tenant-c", 1), ("tenant-a", 2)):
        for _ in range(n):
            made.append((user, await store.create(_spec("w", 1), user)))
    a = [wid for user, wid in made if user == "tenant-a"]
    b = [wid for user, wid in made if user == "tenant-b"]
    (c,) = [wid for user, wid in made if user == "tenant-c"]
    claims = ClaimStore(db.pool, ttl_ms=60_000)
    assert await claims.acquire("workflow", a[1], "elsewhere") is not None  # driven: not swept

    assert await store.unclaimed(100, "shard-0") == [
        a[0], b[0], c, a[2], b[1], a[3], a[4], a[5], a[6], a[7]
    ]  # fmt: skip
    assert await store.unclaimed(3, "shard-0") == [a[0], b[0], c]

    number = {wid: int(wid.removeprefix("wf-")) for _, wid in made}
    rows = [(number[wid], user, wid) for user, wid in made if wid != a[1]]
    own = _round_robin([r for r in rows if r[0] % 2 == 1])
    others = _round_robin([r for r in rows if r[0] % 2 == 0])
    assert await store.unclaimed(100, "shard-1", 1, 2) == own + others


async def test_a_driver_cancelled_twice_gives_its_slot_back(
    make_settings: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel request and an interrupt (or shutdown) both cancel a driver that holds a
    slot; the second lands while the first's cleanup awaits the claim renewer. The slot
    still goes back (held forever, it would shrink the shard for every tenant)."""
    engine = WorkflowEngine(
        _store(db), _Agent(), make_settings(), owner="shard-0", supervisor=make_supervisor()
    )
    holding, renewer_cancelled, renewer_may_end = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def drive(workflow_id: str, fence: Fence) -> None:  # database work, in its slot
        await engine.admission.enter(workflow_id, "ann")
        holding.set()
        await asyncio.Event().wait()

    async def renew(fence: Fence, driver: asyncio.Task[None]) -> None:  # slow to stop
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            renewer_cancelled.set()
            await renewer_may_end.wait()

    monkeypatch.setattr(engine, "_drive_with_retries", drive)
    monkeypatch.setattr(engine, "_renew", renew)
    try:
        wid = await engine.store.create(_spec("w", 1), "ann")
        await engine.start(wid)
        await asyncio.wait_for(holding.wait(), 30)
        driver = engine._driver(wid)
        assert driver is not None and engine.admission.running == 1
        driver.cancel()
        await asyncio.wait_for(renewer_cancelled.wait(), 30)  # its cleanup awaits the renewer
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
        assert engine.admission.running == 0 and engine.admission.queued == 0
        # The claim went back too: the next sweep (anywhere) takes the workflow up.
        assert await engine.claims.holder("workflow", wid) is None
    finally:
        renewer_may_end.set()
        await engine.shutdown()


async def test_the_live_ceiling_waits_for_its_users_lock_a_bounded_time(db: Database) -> None:
    """Another creation of Ann's holds her creation lock (a slow transaction): hers is a
    429 after a bounded wait, not a pool connection held as long as that one runs."""
    store = _store(db)
    async with db.pool.acquire() as other, other.transaction():
        await other.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", LIVE_LOCK, "ann")
        started = time.monotonic()
        with pytest.raises(RateLimited) as caught:
            await asyncio.wait_for(
                store.create_within(_spec("w", 1), "ann", starts=1, ceiling=10), 30
            )
        # Bounded by LIVE_LOCK_WAIT_MS (2 s); generous here for a loaded machine.
        assert time.monotonic() - started < 20
        assert caught.value.extra["limit"] == "workflow_max_live_per_user"
        # Bob's creations do not wait for Ann's lock.
        await asyncio.wait_for(store.create_within(_spec("w", 1), "bob", starts=1, ceiling=10), 30)
    assert await db.pool.fetchval("SELECT count(*) FROM workflows WHERE user_uuid = 'ann'") == 0
    # Her lock free again: she creates, and her transaction's lock_timeout was put back.
    await store.create_within(_spec("w", 1), "ann", starts=1, ceiling=10)
    indexed = await db.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'workflows_live_user'"
    )
    assert indexed is not None and "(user_uuid)" in indexed and "pending" in indexed


async def test_a_spawn_of_more_children_than_the_ceiling_fails_its_step(
    make_settings: Any, db: Database
) -> None:
    """The ceiling lowered below a tree admitted before: its spawn cannot ever fit (a 400,
    not a 429). The spawn step fails naming the setting; no infrastructure retries."""
    settings = make_settings(
        workflow_max_live_per_user=2, workflow_retry_attempts=2, workflow_retry_base_ms=20
    )
    store = _store(db)
    engine = WorkflowEngine(
        store, _Agent(), settings, owner="shard-0", supervisor=make_supervisor()
    )
    leaf = {"name": "leaf", "steps": [{"name": "x", "prompt": "hi"}]}
    spec = WorkflowSpec.parse("root", [{"name": "kids", "type": "spawn", "workflows": [leaf] * 3}])
    try:
        wid = await store.create(spec, "ann")  # admitted under a higher ceiling, say
        await engine.start(wid)
        final = await engine.wait(wid, within=60)
        assert str(final.status) == "failed"
        assert final.error is not None and "workflow_max_live_per_user" in final.error
        assert "infrastructure failure" not in final.error, final.error
        assert str(final.steps[0].status) == "failed"
        assert await store.children(wid) == []
    finally:
        await engine.shutdown()


async def test_a_pattern_search_waits_without_a_database_slot(
    make_settings: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ann's condition waits for a pattern thread (held here until Bob's workflow is done);
    the shard's only database slot is not hers meanwhile: Bob's workflow runs to its end."""
    settings = make_settings(workflow_shard_max_active=1, workflow_shard_tenant_share=1.0)
    engine = WorkflowEngine(
        _store(db), _Agent(), settings, owner="shard-0", supervisor=make_supervisor()
    )
    searching, thread_free = asyncio.Event(), asyncio.Event()
    search = engine._patterns.run

    async def run_later(*args: Any) -> Any:  # the pattern threads busy until `thread_free`
        searching.set()
        await thread_free.wait()
        return await search(*args)

    monkeypatch.setattr(engine._patterns, "run", run_later)
    ann_spec = WorkflowSpec.parse(
        "ann",
        [
            {"name": "a", "prompt": "p"},
            {"name": "c", "prompt": "p", "condition": "{{a.result}} matches 'done'"},
        ],
    )
    try:
        ann = await engine.store.create(ann_spec, "ann")
        await engine.start(ann)
        await asyncio.wait_for(searching.wait(), 30)
        bob = await engine.store.create(_spec("bob", 1), "bob")
        await engine.start(bob)
        assert str((await engine.wait(bob, within=30)).status) == "completed"
        assert str((await engine.store.load(ann)).status) == "running"  # type: ignore[union-attr]
        thread_free.set()
        final = await engine.wait(ann, within=30)
        assert str(final.status) == "completed" and str(final.steps[1].status) == "completed"
        await _drivers_ended(engine, [ann, bob])
        assert engine.admission.running == 0 and engine.admission.queued == 0
    finally:
        thread_free.set()
        await engine.shutdown()
