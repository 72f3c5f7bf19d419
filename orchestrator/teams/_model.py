"""What a team is made of (issue 33): the team of a `coordinate` step, its members (each an
agent task of its own) and the mail between them, as the store reads them back."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.agents import COORDINATOR

__all__ = [
    "COORDINATOR",
    "ID_PATTERN",
    "MAX_MEMBERS",
    "Mail",
    "Member",
    "MemberState",
    "Team",
    "TeamRefused",
    "Why",
]

MAX_MEMBERS = 8  # `team.max_members` is 1..8 (default 4)
ID_PATTERN = re.compile(r"team-[0-9]{1,18}")
MemberState = Literal["running", "finished", "failed", "dismissed", "stopped"]
# team.member_left's `why`, one per state a member leaves in.
Why = Literal["finished", "failed", "dismissed", "stopped"]


class TeamRefused(Exception):
    """A team operation the caller may not do (a limit, an unknown member, a closed team):
    the agent's tool answers it as an error the model sees, never a crash."""


@dataclass(frozen=True, slots=True)
class Team:
    id: str
    user_uuid: str
    workflow_id: str
    step: str
    max_members: int
    state: Literal["open", "destroyed"]
    created_at: int
    destroyed_at: int | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Member:
    team_id: str
    name: str
    role: str
    instructions: str
    tools: tuple[str, ...] | None
    model: str | None
    state: MemberState
    task_id: str
    joined_at: int
    left_at: int | None = None
    result: str | None = None
    error: str | None = None

    def wire(self, *, with_output: bool) -> dict[str, Any]:
        """Its row on GET /teams/{id}; `result` and `error` (the model's words, as mail
        text is) only for the team's owner, else null."""
        return {
            "name": self.name,
            "role": self.role,
            "state": self.state,
            "tools": list(self.tools) if self.tools is not None else None,
            "model": self.model,
            "task_id": self.task_id,
            "joined_at": self.joined_at,
            "left_at": self.left_at,
            "result": self.result if with_output else None,
            "error": self.error if with_output else None,
        }


@dataclass(frozen=True, slots=True)
class Mail:
    id: int
    sender: str
    recipient: str
    body: str
    size: int
    sent_at: int
    read_at: int | None = None

    def wire(self, *, with_text: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "from": self.sender,
            "to": self.recipient,
            "size": self.size,
            "sent_at": self.sent_at,
            "read_at": self.read_at,
        }
        if with_text:
            out["text"] = self.body
        return out
