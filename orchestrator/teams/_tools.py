"""The team tools an agent gets (issue 33) and the life of a team around its coordinator's run.

- The coordinator (the agent of a `coordinate` step with `team`) gets `team_spawn`,
  `team_send`, `team_receive` and `team_dismiss`; a member gets `team_send` and
  `team_receive` (to the coordinator and to each other).
- A member is an agent task of its own (`<team id>:<name>`), sent to the worker pool by the
  same dispatcher as step tasks, with the step's owner, model (unless it names one) and
  timeout, and tools that are a subset of the step's. The coordinator's run drives it: when
  it ends, its final answer (or error) is mailed to the coordinator (`[m1 finished] ...`),
  and `team.member_left` says why (finished, failed).
- A member whose worker is lost is sent again by the dispatcher (same task id: the pool's
  at-least-once for tasks that are not step attempts) and finds its unread mail.
- The team ends with the run of its step: whatever ends the run (an answer, a failure, a
  timeout, a cancel of the workflow), members still running are stopped (their tasks
  cancelled, `team.member_left` why `stopped`) and `team.destroyed` is written.
- Every breach (a limit, an unknown member, a tool outside the step's) is a tool error the
  model sees (`ToolFailed`), never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.agents import AgentTask, TaskResult, TeamSeat
from orchestrator.agents._runner import TaskParked
from orchestrator.agents._tools import Tool, ToolContext, ToolFailed
from orchestrator.config import Settings
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.teams._mailbox import MailWaker, mailbox
from orchestrator.teams._model import COORDINATOR, Member, Team, TeamRefused, Why
from orchestrator.teams._store import TeamStore

log = logging.getLogger(__name__)

__all__ = ["TeamHub"]

Dispatch = Callable[[AgentTask], Awaitable[TaskResult]]
MAX_ROLE = 100
DEFAULT_RECEIVE_S = 30.0


@dataclass(frozen=True, slots=True)
class TeamLimits:
    max_mails: int
    max_message_bytes: int
    receive_max_s: float

    @classmethod
    def of(cls, s: Settings) -> TeamLimits:
        return cls(s.team_max_mails, s.team_max_message_bytes, s.team_receive_max_s)


class TeamHub:
    """A process's side of agent teams: the store, the dispatcher members go through, and
    the mail wake-ups. The agent runner opens a `session` around each run of a team task."""

    def __init__(
        self, store: TeamStore, settings: Settings, dispatch: Dispatch, waker: MailWaker
    ) -> None:
        self.store = store
        self.limits = TeamLimits.of(settings)
        self.dispatch = dispatch
        self.waker = waker

    @contextlib.asynccontextmanager
    async def session(self, task: AgentTask, worker_id: str) -> AsyncIterator[_Room | None]:
        seat = task.team
        if seat is None:
            yield None
            return
        if not seat.coordinates:
            yield _Room(self, task, seat.team_id or "", seat.member)
            return
        if task.workflow_id is None or task.step is None:
            yield None  # a team belongs to a workflow's step
            return
        team = await self.store.open(
            workflow_id=task.workflow_id,
            step=task.step,
            user_uuid=task.user_uuid,
            max_members=seat.max_members,
            task_id=task.task_id,
        )
        room = _Coordinator(self, task, team)
        reason = "step failed"
        try:
            yield room
            reason = "step completed"
        except TaskParked:
            # Not a failure: the run waits for a person; the resumed run reopens the team.
            reason = "waiting for a decision"
            raise
        except asyncio.CancelledError:
            reason = "step stopped (cancelled or timed out)"
            raise
        finally:
            ending = asyncio.ensure_future(room.close(reason))
            try:
                await asyncio.shield(ending)
            except asyncio.CancelledError:
                ending.add_done_callback(_log_failure)
                raise
            except Exception:
                log.exception("team %s: cannot close", team.id)


def _log_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("team close failed: %r", done.exception())


_SEND = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "description": "a member's name (m1, ...) or 'coordinator'"},
        "message": {"type": "string"},
    },
    "required": ["to", "message"],
}
_RECEIVE = {
    "type": "object",
    "properties": {
        "timeout_s": {"type": "number", "description": "how long to wait for mail, seconds"}
    },
}
_SPAWN = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "description": "what the member is, e.g. researcher"},
        "instructions": {"type": "string", "description": "the member's task"},
        "tools": {
            "type": "array",
            "items": {"type": "string"},
            "description": "its tools, among this step's (default: the step's)",
        },
        "model": {"type": "string", "description": "its model (default: this step's)"},
    },
    "required": ["role", "instructions"],
}
_DISMISS = {
    "type": "object",
    "properties": {"member": {"type": "string", "description": "the member's name"}},
    "required": ["member"],
}


def _text(args: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = args.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ToolFailed(f"'{key}' (a non-empty string) is required")
    return value


class _Room:
    """A member's (or, subclassed, the coordinator's) place in team `team_id`."""

    def __init__(self, hub: TeamHub, task: AgentTask, team_id: str, name: str) -> None:
        self.hub = hub
        self.task = task
        self.team_id = team_id
        self.name = name

    @property
    def note(self) -> str:
        return (
            f"## Team\nYou are {self.name} in team {self.team_id}. team_send(to, message) "
            "mails the coordinator ('coordinator') or another member; team_receive(timeout_s)"
            " waits for the next mail to you."
        )

    def tools(self) -> list[Tool]:
        return [
            Tool("team_send", "Mail a team member or the coordinator.", _SEND, self._send, "team"),
            Tool(
                "team_receive",
                "Wait for the next mail to you (returns it, or says none came in time).",
                _RECEIVE,
                self._receive,
                "team",
            ),
        ]

    async def _team(self) -> Team:
        seat = await self.hub.store.seat(self.team_id, self.name)
        if seat is None or seat[1].state != "running":
            raise ToolFailed("you are no longer in the team")
        return seat[0]

    async def _send(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        to, message = _text(args, "to"), args.get("message")
        if not isinstance(message, str):
            raise ToolFailed("'message' (a string) is required")
        assert to is not None
        limits = self.hub.limits
        try:
            mail = await self.hub.store.send(
                await self._team(),
                self.name,
                to.strip(),
                message,
                max_mails=limits.max_mails,
                max_bytes=limits.max_message_bytes,
            )
        except TeamRefused as exc:
            raise ToolFailed(str(exc)) from None
        self.hub.waker.poke(mailbox(self.team_id, mail.recipient))
        return f"sent to {mail.recipient} ({mail.size} bytes)"

    async def _receive(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        wanted = args.get("timeout_s", DEFAULT_RECEIVE_S)
        if isinstance(wanted, bool) or not isinstance(wanted, int | float) or wanted < 0:
            raise ToolFailed("'timeout_s' must be a number of seconds, 0 or more")
        timeout = min(float(wanted), self.hub.limits.receive_max_s)
        team = await self._team()
        mail = await self.hub.waker.wait_for(
            mailbox(team.id, self.name), lambda: self.hub.store.take(team, self.name), timeout
        )
        if mail is None:
            return f"no mail within {timeout:g}s"
        return json.dumps({"from": mail.sender, "text": mail.body})


class _Coordinator(_Room):
    """The coordinator's place: it also spawns and dismisses members, and drives them."""

    def __init__(self, hub: TeamHub, task: AgentTask, team: Team) -> None:
        super().__init__(hub, task, team.id, COORDINATOR)
        self.team = team
        self._drivers: dict[str, asyncio.Task[None]] = {}

    @property
    def note(self) -> str:
        return (
            f"## Team\nYou lead team {self.team.id} (at most {self.team.max_members} members"
            " running at once). team_spawn(role, instructions, tools?, model?) starts a member"
            " (named m1, m2, ...); team_send(to, message) mails one; team_receive(timeout_s)"
            " waits for mail to you (a member's final answer comes as mail too);"
            " team_dismiss(member) ends one. Members still running when you answer are stopped."
        )

    def tools(self) -> list[Tool]:
        return [
            Tool("team_spawn", "Start a team member.", _SPAWN, self._spawn, "team"),
            *super().tools(),
            Tool("team_dismiss", "End a team member.", _DISMISS, self._dismiss, "team"),
        ]

    async def _team(self) -> Team:
        return self.team

    async def _spawn(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        role, instructions = _text(args, "role"), _text(args, "instructions")
        model = _text(args, "model", required=False)
        assert role is not None and instructions is not None
        if len(role) > MAX_ROLE:
            raise ToolFailed(f"'role' has at most {MAX_ROLE} characters")
        if len(instructions.encode()) > self.hub.limits.max_message_bytes:
            raise ToolFailed(
                f"'instructions' has at most {self.hub.limits.max_message_bytes} bytes"
                " (team_max_message_bytes)"
            )
        tools = self._tools_of(args.get("tools"))
        try:
            member = await self.hub.store.join(
                self.team,
                role=role.strip(),
                instructions=instructions,
                tools=tools,
                model=model,
                task_prefix=self.team.id,
            )
        except TeamRefused as exc:
            raise ToolFailed(str(exc)) from None
        driver = asyncio.create_task(self._drive(member), name=f"team-{member.task_id}")
        self._drivers[member.name] = driver
        return json.dumps({"member": member.name, "role": member.role, "task_id": member.task_id})

    def _tools_of(self, given: Any) -> tuple[str, ...] | None:
        step_tools = self.task.tools
        if given is None:
            return step_tools
        if not isinstance(given, list) or not all(isinstance(t, str) and t for t in given):
            raise ToolFailed("'tools' must be an array of tool names")
        if step_tools is not None:
            outside = [t for t in given if t not in step_tools]
            if outside:
                raise ToolFailed(
                    f"not among this step's tools: {', '.join(outside)} (a member's tools"
                    f" are a subset of the step's: {', '.join(step_tools) or 'none'})"
                )
        return tuple(dict.fromkeys(given))

    def _member_task(self, member: Member) -> AgentTask:
        task = self.task
        intro = (
            f"You are {member.name}, the {member.role} of team {self.team.id}; the"
            f" coordinator (the agent of step {task.step}) gave you the task below."
        )
        return AgentTask(
            task_id=member.task_id,
            user_uuid=task.user_uuid,
            prompt=member.instructions,
            context=(("Team", intro),),
            tools=member.tools,
            timeout_s=task.timeout_s,
            model=member.model or task.model,
            workflow_id=task.workflow_id,
            step=task.step,
            team=TeamSeat(member=member.name, team_id=self.team.id),
        )

    async def _drive(self, member: Member) -> None:
        """Run the member to its end and record how it ended (a cancel is its stop or
        dismissal, recorded by whoever cancelled it)."""
        state: Why
        answer: str | None
        error: str | None
        try:
            result = await self.hub.dispatch(self._member_task(member))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the pool's failure is the member's
            state, answer, error = "failed", None, f"{type(exc).__name__}: {exc}"[:2000]
        else:
            state = "finished" if result.ok else "failed"
            answer, error = result.result, result.error
        limits = self.hub.limits
        try:
            await self.hub.store.leave(
                self.team,
                member.name,
                state,
                result=answer,
                error=error,
                tell=(limits.max_mails, limits.max_message_bytes),
            )
        except Exception:
            log.exception("team %s: cannot record the end of %s", self.team.id, member.name)
        self.hub.waker.poke(mailbox(self.team.id, COORDINATOR))

    async def _dismiss(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        name = _text(args, "member")
        assert name is not None
        name = name.strip()
        left = await self.hub.store.leave(self.team, name, "dismissed")
        if not left:
            raise ToolFailed(f"no running member {name!r}")
        driver = self._drivers.pop(name, None)
        if driver is not None:
            await _stop([driver])
        return f"dismissed {name}"

    async def close(self, reason: str) -> None:
        """The step's run ended: stop the members' tasks, then record the team's end."""
        drivers, self._drivers = list(self._drivers.values()), {}
        await _stop(drivers)
        await self.hub.store.destroy(self.team, reason)


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    # The house's cancel-then-await: a cancel lost inside asyncpg's wait_for is sent again.
    await cancel_and_wait(tasks)
