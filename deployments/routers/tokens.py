"""API tokens: issued by admins, revocable by prefix; and who the caller is."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.deps import BIGINT_MAX, AdminUser, Auth, CurrentUser, Events, Tokens
from orchestrator import wire
from orchestrator.errors import NotFound
from orchestrator.events import NewEvent

router = APIRouter(tags=["tokens"])

USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:\-]{0,127}$"
MAX_LIFETIME_S = 10 * 366 * 86_400  # ten years: anything longer is "never" (omit both)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_uuid: str = Field(pattern=USER_PATTERN, description="The user the token acts as")
    admin: bool = False
    description: str = Field("", max_length=200)
    expires_in: int | None = Field(
        None, ge=1, le=MAX_LIFETIME_S, description="Seconds from now until the token expires"
    )
    expires_at: int | None = Field(
        None,
        ge=1,
        le=BIGINT_MAX,
        description="When the token expires, Unix milliseconds (in the future)",
    )

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenCreate:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        return self


@router.post("/tokens", response_model=wire.TokenCreated)
async def create_token(
    body: TokenCreate, events: Events, tokens: Tokens, caller: AdminUser
) -> wire.TokenCreated:
    expires_at = body.expires_at
    if body.expires_in is not None:
        expires_at = int(time.time() * 1000) + body.expires_in * 1000
    async with events.transaction() as tx:
        issued = await tokens.create(
            body.user_uuid, body.admin, body.description, tx.conn, expires_at=expires_at
        )
        # The grant is an event of the new token's user: it shows on their stream.
        await tx.append(
            [
                NewEvent(
                    "audit.permission_grant",
                    {
                        "user_uuid": body.user_uuid,
                        "admin": body.admin,
                        "granted_by": caller.user_uuid,
                        "token_prefix": issued.prefix,
                        "expires_at": issued.expires_at,
                    },
                    user_uuid=body.user_uuid,
                )
            ]
        )
    return wire.TokenCreated(
        token=issued.token,
        prefix=issued.prefix,
        user_uuid=issued.user_uuid,
        admin=issued.admin,
        expires_at=issued.expires_at,
    )


@router.delete("/tokens/{prefix}", response_model=wire.TokenRevoked)
async def revoke_token(
    prefix: Annotated[str, Path(min_length=8, max_length=64)],
    tokens: Tokens,
    authenticator: Auth,
    caller: CurrentUser,
) -> wire.TokenRevoked:
    # Admins revoke any token; a user only their own (someone else's is simply not found).
    owner = None if caller.is_admin else caller.user_uuid
    hashes = await tokens.revoke(prefix, owner=owner)
    if not hashes:
        raise NotFound(f"no live token with prefix {prefix!r}")
    authenticator.forget(hashes)
    return wire.TokenRevoked(revoked=len(hashes))


@router.get("/whoami", response_model=wire.WhoAmI)
async def whoami(caller: CurrentUser) -> wire.WhoAmI:
    return wire.WhoAmI(user_uuid=caller.user_uuid, admin=caller.is_admin)
