"""Agent teams (issue 33): what GET /teams/{id} answers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.wire._base import ApiModel, left_out_when_none

__all__ = ["Team", "TeamMail", "TeamMember"]


class TeamMember(ApiModel):
    name: str = Field(description="`m1`, `m2`, ...: what team_send's `to` names")
    role: str
    state: Literal["running", "finished", "failed", "dismissed", "stopped"]
    tools: list[str] | None = Field(description="Its tools; null: every tool of the step")
    model: str | None = Field(description="Its own model; null: the step's")
    task_id: str = Field(description="Its agent task (the aggregate of its task.* events)")
    joined_at: int = Field(description="Unix ms")
    left_at: int | None = Field(description="Unix ms, once it left")
    result: str | None = Field(description="Its final answer, once finished")
    error: str | None = Field(description="Why it failed or was stopped")


class TeamMail(ApiModel):
    id: int
    sender: str = Field(alias="from", description="`coordinator` or a member's name")
    to: str
    size: int = Field(description="Bytes of UTF-8")
    sent_at: int = Field(description="Unix ms")
    read_at: int | None = Field(description="Unix ms, once its recipient took it")
    text: str | None = Field(
        None,
        description="The message: shown to the team's owner only (never in events)",
        exclude_if=left_out_when_none,
    )


class Team(ApiModel):
    ok: bool = True
    id: str = Field(description="`team-<n>`")
    workflow_id: str
    step: str = Field(description="The coordinate step the team belongs to")
    state: Literal["open", "destroyed"]
    max_members: int = Field(description="Members running at once, at most")
    created_at: int = Field(description="Unix ms")
    destroyed_at: int | None = Field(description="Unix ms, once its step's run ended")
    reason: str | None = Field(description="Why it was destroyed")
    members: list[TeamMember]
    mail: list[TeamMail] = Field(description="The mail log, oldest first")
