"""Fairness across tenants on a workflow shard (issue 29), against real Postgres with an
engine over a shard-sized pool: one tenant's backlog of step transitions does not queue
another tenant's workflow behind it (the drivers' database work is admitted per tenant),
and the recovery sweep takes unclaimed workflows round-robin by tenant, not oldest first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.runtime.claims import ClaimStore
from orchestrator.workflows import WorkflowEngine, WorkflowStore
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
    engine = WorkflowEngine(store, agent, settings, owner="shard-0")
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
        assert engine.admission.running == 0 and engine.admission.queued == 0
    finally:
        a_done.set()
        a_hold.set()
        await engine.shutdown()


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
