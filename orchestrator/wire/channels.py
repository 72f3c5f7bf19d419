"""Messaging channels (SPEC part 4, channels): CRUD answers and the webhook receiver's."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestrator.wire._base import ApiModel

__all__ = [
    "Channel",
    "ChannelCreated",
    "ChannelDeleted",
    "ChannelList",
    "ChannelUpdated",
    "CreatedChannel",
    "WebhookAck",
]


class Channel(ApiModel):
    id: str
    type: str = Field(description="slack, teams, telegram or webhook")
    name: str
    status: str = Field(description="active, paused or error")
    config: dict[str, Any] = Field(description="Type-specific settings; secrets as `***`")
    user_uuid: str
    failures: int = Field(description="Failed deliveries in a row")
    last_error: str | None
    created_at: int
    updated_at: int


class CreatedChannel(Channel):
    """The webhook token is shown only here (and when rotated)."""

    webhook_token: str = Field(description="Shown once: the receiver is webhook_path")
    webhook_path: str


class ChannelList(ApiModel):
    ok: bool = True
    data: list[Channel]


class ChannelCreated(ApiModel):
    ok: bool = True
    data: CreatedChannel


class ChannelUpdated(ApiModel):
    ok: bool = True
    data: Channel
    webhook_token: str | None = Field(default=None, description="The new token, when rotated")
    webhook_path: str | None = None


class ChannelDeleted(ApiModel):
    ok: bool = True
    deleted: str


class WebhookAck(ApiModel):
    ok: bool = True
    accepted: bool = Field(description="Relayed to the agent (false: ignored or a duplicate)")
    duplicate: bool = False
    ignored: str | None = Field(default=None, description="Why nothing was relayed")
    answer: str | None = Field(default=None, description="Synchronous generic webhooks: the answer")
