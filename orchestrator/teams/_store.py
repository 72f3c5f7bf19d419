"""Teams in Postgres (migration 0031): every state change commits with the `team.*` event
that describes it, in one transaction (the events writer's `transaction`), under the team
row's lock, so the limits (members, mails) hold against concurrent callers.

- **Keying.** A team is keyed by its workflow and step (`open`): a coordinator run again
  (after a lost worker, a retry, a drain) finds the same team and its unread mail. A team
  destroyed when an earlier run ended is opened again (`team.created` with `reopened`).
- **Orphans.** Members still `running` when a new coordinator run opens the team were driven
  by a run that is gone (their worker's result would reach nobody): they are marked failed
  (`team.member_left` why `failed`) and the new run may spawn others.
- **Scoping.** Every row carries its owner's user_uuid; `detail` shows a team to its owner
  and admins (anyone else: 404), the mail text and members' results and errors to the
  owner only. Events carry sizes, never text.
- **Ends.** The coordinator's run destroys its team when it ends (`destroy`); the engine's
  transition that ends the workflow, or fails the step finally, closes a team left open
  (a coordinator whose worker was lost: `_ending.close_open_in`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import NotFound
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.teams._ending import STOPPED_ERROR
from orchestrator.teams._mailbox import MAIL_CHANNEL, mailbox
from orchestrator.teams._model import (
    COORDINATOR,
    ID_PATTERN,
    Mail,
    Member,
    Team,
    TeamRefused,
    Why,
)

__all__ = ["TeamStore"]

_TEAM = "id, user_uuid, workflow_id, step, max_members, state, created_at, destroyed_at, reason"
_MEMBER = (
    "team_id, name, role, instructions, tools, model, state, task_id, joined_at, left_at,"
    " result, error"
)
_MAIL = "id, sender, recipient, body, size, sent_at, read_at"
# A member's final answer, told to the coordinator as a mail, is cut to fit the size limit.
_RESULT_NOTE = "[{name} {state}] "


def _team(row: asyncpg.Record) -> Team:
    return Team(**dict(row))


def _member(row: asyncpg.Record) -> Member:
    data = dict(row)
    data["tools"] = tuple(data["tools"]) if data["tools"] is not None else None
    return Member(**data)


def _mail(row: asyncpg.Record) -> Mail:
    return Mail(**dict(row))


def _cut(text: str, max_bytes: int) -> str:
    raw = text.encode()
    return text if len(raw) <= max_bytes else raw[:max_bytes].decode(errors="ignore")


class TeamStore:
    def __init__(self, pool: asyncpg.Pool, events: EventStore) -> None:
        self._pool = pool
        self._events = events

    # --- the coordinator's run ------------------------------------------------------------

    async def open(
        self, *, workflow_id: str, step: str, user_uuid: str, max_members: int, task_id: str
    ) -> Team:
        """The team of `workflow_id`'s `step`, created or opened again for the run `task_id`
        (see the module docstring: orphans are failed here)."""
        async with self._events.transaction() as tx:
            row = await tx.conn.fetchrow(
                "WITH n AS (SELECT nextval('team_seq') AS number)"
                " INSERT INTO teams (id, number, user_uuid, workflow_id, step, max_members,"
                f" coordinator, created_at) SELECT 'team-' || n.number, n.number, $1, $2, $3,"
                f" $4, $5, {DB_NOW_MS} FROM n ON CONFLICT (workflow_id, step) DO NOTHING"
                f" RETURNING {_TEAM}",
                user_uuid,
                workflow_id,
                step,
                max_members,
                task_id,
            )
            if row is not None:
                team = _team(row)
                await tx.append([self._created(team)])
                return team
            row = await tx.conn.fetchrow(
                "SELECT state FROM teams WHERE workflow_id = $1 AND step = $2 FOR UPDATE",
                workflow_id,
                step,
            )
            reopened = row["state"] == "destroyed"
            row = await tx.conn.fetchrow(
                "UPDATE teams SET state = 'open', destroyed_at = NULL, reason = NULL,"
                " coordinator = $3, max_members = $4 WHERE workflow_id = $1 AND step = $2"
                f" RETURNING {_TEAM}",
                workflow_id,
                step,
                task_id,
                max_members,
            )
            team = _team(row)
            if reopened:
                await tx.append([self._created(team, reopened=True)])
            await self._leave(tx, team, "running", "failed", error="its coordinator's run was lost")
            return team

    @staticmethod
    def _created(team: Team, *, reopened: bool = False) -> NewEvent:
        data: dict[str, Any] = {
            "team_id": team.id,
            "workflow_id": team.workflow_id,
            "step": team.step,
            "max_members": team.max_members,
        }
        if reopened:
            data["reopened"] = True
        return NewEvent("team.created", data, team.user_uuid)

    async def destroy(self, team: Team, reason: str) -> None:
        """The step's run ended: members still running are stopped (why `stopped`), then
        `team.destroyed`. A team destroyed already is left as it is."""
        async with self._events.transaction() as tx:
            state = await tx.conn.fetchval(
                "SELECT state FROM teams WHERE id = $1 FOR UPDATE", team.id
            )
            if state != "open":
                return
            await self._leave(tx, team, "running", "stopped", error=STOPPED_ERROR)
            await tx.conn.execute(
                f"UPDATE teams SET state = 'destroyed', destroyed_at = {DB_NOW_MS}, reason = $2"
                " WHERE id = $1",
                team.id,
                reason,
            )
            await tx.append(
                [NewEvent("team.destroyed", {"team_id": team.id, "reason": reason}, team.user_uuid)]
            )

    async def _leave(
        self,
        tx: EventTransaction,
        team: Team,
        current: str,
        state: Why,
        *,
        name: str | None = None,
        error: str | None = None,
        result: str | None = None,
    ) -> list[str]:
        """Members in state `current` (all, or `name`) leave in `state`, each with its
        `team.member_left`; their names."""
        rows = await tx.conn.fetch(
            f"UPDATE team_members SET state = $3, left_at = {DB_NOW_MS},"
            " error = COALESCE($5, error), result = COALESCE($6, result)"
            " WHERE team_id = $1 AND state = $2 AND ($4::text IS NULL OR name = $4)"
            " RETURNING name",
            team.id,
            current,
            state,
            name,
            error,
            result,
        )
        names = sorted(r["name"] for r in rows)
        if names:
            await tx.append(
                [
                    NewEvent(
                        "team.member_left",
                        {"team_id": team.id, "member": n, "why": state},
                        team.user_uuid,
                    )
                    for n in names
                ]
            )
        return names

    async def _lock_open(self, tx: EventTransaction, team: Team) -> None:
        state = await tx.conn.fetchval("SELECT state FROM teams WHERE id = $1 FOR UPDATE", team.id)
        if state != "open":
            raise TeamRefused("the team has ended (its step is over)")

    async def join(
        self,
        team: Team,
        *,
        role: str,
        instructions: str,
        tools: Sequence[str] | None,
        model: str | None,
        task_prefix: str,
    ) -> Member:
        """A new running member (`team.member_joined`), within `max_members` running at
        once; its task id is `<task_prefix>:<name>`."""
        async with self._events.transaction() as tx:
            await self._lock_open(tx, team)
            counts = await tx.conn.fetchrow(
                "SELECT count(*) AS total, count(*) FILTER (WHERE state = 'running') AS running"
                " FROM team_members WHERE team_id = $1",
                team.id,
            )
            if counts["running"] >= team.max_members:
                raise TeamRefused(
                    f"the team has {counts['running']} running members, at most"
                    f" {team.max_members} (team.max_members): dismiss one first"
                )
            name = f"m{counts['total'] + 1}"
            row = await tx.conn.fetchrow(
                "INSERT INTO team_members (team_id, name, user_uuid, role, instructions, tools,"
                f" model, task_id, joined_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
                f" {DB_NOW_MS}) RETURNING {_MEMBER}",
                team.id,
                name,
                team.user_uuid,
                role,
                instructions,
                list(tools) if tools is not None else None,
                model,
                f"{task_prefix}:{name}",
            )
            member = _member(row)
            data: dict[str, Any] = {
                "team_id": team.id,
                "member": name,
                "role": role,
                "task_id": member.task_id,
            }
            if tools is not None:
                data["tools"] = list(tools)
            await tx.append([NewEvent("team.member_joined", data, team.user_uuid)])
            return member

    async def leave(
        self,
        team: Team,
        name: str,
        state: Why,
        *,
        result: str | None = None,
        error: str | None = None,
        tell: tuple[int, int] | None = None,
    ) -> bool:
        """Member `name` leaves in `state` if it still runs (False: it had left already).
        `tell` (max_mails, max_message_bytes): its result or error goes to the
        coordinator as a mail, when the team's mail limit leaves room for it."""
        async with self._events.transaction() as tx:
            await tx.conn.execute("SELECT 1 FROM teams WHERE id = $1 FOR UPDATE", team.id)
            left = await self._leave(
                tx, team, "running", state, name=name, error=error, result=result
            )
            if not left or tell is None:
                return bool(left)
            max_mails, max_bytes = tell
            sent = await tx.conn.fetchval(
                "SELECT count(*) FROM team_mail WHERE team_id = $1", team.id
            )
            if sent < max_mails:
                text = _RESULT_NOTE.format(name=name, state=state) + (result or error or "")
                await self._mail(tx, team, name, COORDINATOR, _cut(text, max_bytes))
            return True

    # --- mail -----------------------------------------------------------------------------

    async def send(
        self,
        team: Team,
        sender: str,
        to: str,
        body: str,
        *,
        max_mails: int,
        max_bytes: int,
    ) -> Mail:
        """A mail from `sender` to `to` (the coordinator or a running member), with
        `team.mail_sent`; the limits are TeamRefused."""
        size = len(body.encode())
        if size > max_bytes:
            raise TeamRefused(
                f"the message is {size} bytes, at most {max_bytes} (team_max_message_bytes)"
            )
        if to == sender:
            raise TeamRefused("a member cannot send mail to itself")
        async with self._events.transaction() as tx:
            await self._lock_open(tx, team)
            running = {
                r["name"]
                for r in await tx.conn.fetch(
                    "SELECT name FROM team_members WHERE team_id = $1 AND state = 'running'",
                    team.id,
                )
            }
            if sender != COORDINATOR and sender not in running:
                raise TeamRefused(f"{sender} is no longer in the team")
            if to != COORDINATOR and to not in running:
                known = ", ".join(sorted(running | {COORDINATOR}))
                raise TeamRefused(f"no running member {to!r}; send to one of: {known}")
            sent = await tx.conn.fetchval(
                "SELECT count(*) FROM team_mail WHERE team_id = $1", team.id
            )
            if sent >= max_mails:
                raise TeamRefused(
                    f"the team has sent {sent} mails, at most {max_mails} (team_max_mails)"
                )
            return await self._mail(tx, team, sender, to, body)

    async def _mail(
        self, tx: EventTransaction, team: Team, sender: str, to: str, body: str
    ) -> Mail:
        size = len(body.encode())
        row = await tx.conn.fetchrow(
            "INSERT INTO team_mail (team_id, user_uuid, sender, recipient, body, size,"
            f" sent_at) VALUES ($1, $2, $3, $4, $5, $6, {DB_NOW_MS}) RETURNING {_MAIL}",
            team.id,
            team.user_uuid,
            sender,
            to,
            body,
            size,
        )
        # Wakes that mailbox's waiters only, at the commit (_mailbox.py).
        await tx.conn.execute("SELECT pg_notify($1, $2)", MAIL_CHANNEL, mailbox(team.id, to))
        await tx.append(
            [
                NewEvent(
                    "team.mail_sent",
                    {"team_id": team.id, "from": sender, "to": to, "size": size},
                    team.user_uuid,
                )
            ]
        )
        return _mail(row)

    async def take(self, team: Team, recipient: str) -> Mail | None:
        """The oldest unread mail to `recipient`, marked read (None: none waits). Read once:
        concurrent takers never get the same mail."""
        row = await self._pool.fetchrow(
            f"UPDATE team_mail SET read_at = {DB_NOW_MS} WHERE id = (SELECT id FROM team_mail"
            " WHERE team_id = $1 AND recipient = $2 AND read_at IS NULL ORDER BY id LIMIT 1"
            f" FOR UPDATE SKIP LOCKED) RETURNING {_MAIL}",
            team.id,
            recipient,
        )
        return _mail(row) if row is not None else None

    # --- reading --------------------------------------------------------------------------

    async def seat(self, team_id: str, name: str) -> tuple[Team, Member] | None:
        """Team `team_id` and its member `name` (None: no such member)."""
        row = await self._pool.fetchrow(f"SELECT {_TEAM} FROM teams WHERE id = $1", team_id)
        member = await self._pool.fetchrow(
            f"SELECT {_MEMBER} FROM team_members WHERE team_id = $1 AND name = $2",
            team_id,
            name,
        )
        if row is None or member is None:
            return None
        return _team(row), _member(member)

    async def members(self, team_id: str) -> list[Member]:
        rows = await self._pool.fetch(
            f"SELECT {_MEMBER} FROM team_members WHERE team_id = $1"
            " ORDER BY joined_at, length(name), name",
            team_id,
        )
        return [_member(r) for r in rows]

    async def detail(self, team_id: str, principal: Principal) -> dict[str, Any]:
        """GET /teams/{id}: the team, its members and its mail log (the mail text and the
        members' result and error for its owner only); another tenant's team does not
        exist (404)."""
        row = None
        if ID_PATTERN.fullmatch(team_id):
            row = await self._pool.fetchrow(
                f"SELECT {_TEAM} FROM teams WHERE id = $1 AND (user_uuid = $2 OR $3)",
                team_id,
                principal.user_uuid,
                principal.is_admin,
            )
        if row is None:
            raise NotFound(f"team {team_id!r} not found")
        team = _team(row)
        mails = await self._pool.fetch(
            f"SELECT {_MAIL} FROM team_mail WHERE team_id = $1 ORDER BY id", team_id
        )
        own = principal.user_uuid == team.user_uuid
        return {
            "id": team.id,
            "workflow_id": team.workflow_id,
            "step": team.step,
            "state": team.state,
            "max_members": team.max_members,
            "created_at": team.created_at,
            "destroyed_at": team.destroyed_at,
            "reason": team.reason,
            "members": [m.wire(with_output=own) for m in await self.members(team_id)],
            "mail": [_mail(r).wire(with_text=own) for r in mails],
        }
