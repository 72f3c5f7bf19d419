"""API tokens and the caller's identity (POST /tokens, DELETE /tokens/{prefix}, GET /whoami)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.wire._base import ApiModel

__all__ = ["TokenCreated", "TokenRevoked", "WhoAmI"]


class WhoAmI(ApiModel):
    ok: bool = True
    user_uuid: str
    admin: bool


class TokenCreated(ApiModel):
    """A newly issued token. `token` is shown only here; `prefix` identifies it later."""

    ok: bool = True
    token: str
    prefix: str
    user_uuid: str
    admin: bool
    expires_at: int | None = Field(None, description="Unix ms; null: the token never expires")


class TokenRevoked(ApiModel):
    ok: bool = True
    revoked: int
