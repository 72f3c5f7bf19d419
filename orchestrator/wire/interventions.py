"""Interventions (issue 32): what the list, the detail and a decision answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from orchestrator.wire._base import ApiModel, left_out_when_none

__all__ = ["Intervention", "InterventionDecided", "InterventionPage"]


def _optional(description: str) -> Any:
    return Field(None, description=description, exclude_if=left_out_when_none)


class Intervention(ApiModel):
    """A decision a workflow step waits for: a tool call under an `ask` policy rule (`tool`,
    `arguments` with secrets masked) or an approval step. The optional fields are sent only
    when they have a value."""

    id: str = Field(description="`iv-<n>`")
    kind: Literal["tool", "approval"]
    status: Literal["pending", "approved", "rejected", "expired"]
    user_uuid: str = Field(description="The workflow's owner")
    workflow_id: str
    step: str
    task_id: str = Field(description="The step attempt (the aggregate of its audit events)")
    tool: str | None = _optional("The tool the call would run (kind tool)")
    arguments: dict[str, Any] | None = _optional("The call's arguments, secrets masked")
    question: str
    deciders: list[str] = Field(description="Who decides besides admins (user_uuid)")
    notify_channel: str | None = _optional("The channel the question is posted to")
    expires_at: int = Field(description="Unix ms: undecided then, it is expired (rejected)")
    created_at: int = Field(description="Unix ms")
    decided_at: int | None = _optional("Unix ms")
    decided_by: dict[str, Any] | None = _optional(
        "{user_uuid} from the API, {platform, platform_user, channel_id} from a channel"
    )
    via: str | None = _optional(
        "api, slack, telegram, teams, webhook, timeout (expired) or cancel (the workflow ended)"
    )
    note: str | None = _optional("The approver's note")
    reason: str | None = _optional("Why it was rejected (`expired` for an expiry)")


class InterventionPage(ApiModel):
    ok: bool = True
    data: list[Intervention]
    total: int
    limit: int
    offset: int


class InterventionDecided(ApiModel):
    ok: bool = True
    id: str
    status: Literal["approved", "rejected"]
