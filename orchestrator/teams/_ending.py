"""The end of teams a lost coordinator left open (issue 33), written by the workflow
engine's transitions: a coordinator whose worker was lost never destroys its team
(`TeamStore.destroy`), and its step may never run again to do it (no retry left, the
workflow cancelled). So the transaction that records a step's final failure, or a
workflow's end, closes the step's (the workflow's) open teams too.

A module of its own, importing neither the agent loop nor the providers: the workflow
shards load it (tests/unit/test_actor_imports.py), and the package's `__init__` imports
the rest lazily for the same reason."""

from __future__ import annotations

from orchestrator.db import DB_NOW_MS
from orchestrator.events import EventTransaction, NewEvent

__all__ = ["close_open_in"]

STOPPED_ERROR = "the team's step ended"


async def close_open_in(
    tx: EventTransaction, workflow_id: str, reason: str, step: str | None = None
) -> None:
    """In `tx` (which holds the workflow's row): the open teams of `workflow_id` (of its
    `step` only, when given) are destroyed with `reason`, their running members stopped;
    the same events as `TeamStore.destroy` (team.member_left why `stopped`,
    team.destroyed). One statement. Lock order: the workflow row, then the team rows; no
    team transaction takes a workflow row."""
    rows = await tx.conn.fetch(
        f"WITH t AS (UPDATE teams SET state = 'destroyed', destroyed_at = {DB_NOW_MS},"
        " reason = $3 WHERE workflow_id = $1 AND ($2::text IS NULL OR step = $2)"
        " AND state = 'open' RETURNING id, user_uuid),"
        f" m AS (UPDATE team_members SET state = 'stopped', left_at = {DB_NOW_MS},"
        " error = $4 WHERE state = 'running' AND team_id IN (SELECT id FROM t)"
        " RETURNING team_id, name)"
        " SELECT t.id, t.user_uuid, ARRAY(SELECT m.name FROM m WHERE m.team_id = t.id"
        " ORDER BY m.name) AS names FROM t ORDER BY t.id",
        workflow_id,
        step,
        reason,
        STOPPED_ERROR,
    )
    events: list[NewEvent] = []
    for row in rows:
        team_id, owner = row["id"], row["user_uuid"]
        events.extend(
            NewEvent("team.member_left", {"team_id": team_id, "member": n, "why": "stopped"}, owner)
            for n in row["names"]
        )
        events.append(NewEvent("team.destroyed", {"team_id": team_id, "reason": reason}, owner))
    if events:
        await tx.append(events)
