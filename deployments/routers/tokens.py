"""API tokens: issued by admins, revocable by prefix; and who the caller is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import AdminUser, Ctx, CurrentUser
from orchestrator.errors import NotFound
from orchestrator.events import NewEvent

router = APIRouter(tags=["tokens"])

USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:\-]{0,127}$"


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_uuid: str = Field(pattern=USER_PATTERN, description="The user the token acts as")
    admin: bool = False
    description: str = Field("", max_length=200)


class TokenCreated(BaseModel):
    ok: bool = True
    token: str
    prefix: str
    user_uuid: str
    admin: bool


class TokenRevoked(BaseModel):
    ok: bool = True
    revoked: int


class WhoAmI(BaseModel):
    ok: bool = True
    user_uuid: str
    admin: bool


@router.post("/tokens", response_model=TokenCreated)
async def create_token(body: TokenCreate, ctx: Ctx, caller: AdminUser) -> TokenCreated:
    async with ctx.events.transaction() as tx:
        issued = await ctx.tokens.create(body.user_uuid, body.admin, body.description, tx.conn)
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
                    },
                    user_uuid=body.user_uuid,
                )
            ]
        )
    return TokenCreated(
        token=issued.token, prefix=issued.prefix, user_uuid=issued.user_uuid, admin=issued.admin
    )


@router.delete("/tokens/{prefix}", response_model=TokenRevoked)
async def revoke_token(
    prefix: Annotated[str, Path(min_length=8, max_length=64)], ctx: Ctx, caller: CurrentUser
) -> TokenRevoked:
    # Admins revoke any token; a user only their own (someone else's is simply not found).
    owner = None if caller.is_admin else caller.user_uuid
    hashes = await ctx.tokens.revoke(prefix, owner=owner)
    if not hashes:
        raise NotFound(f"no live token with prefix {prefix!r}")
    ctx.authenticator.forget(hashes)
    return TokenRevoked(revoked=len(hashes))


@router.get("/whoami", response_model=WhoAmI)
async def whoami(caller: CurrentUser) -> WhoAmI:
    return WhoAmI(user_uuid=caller.user_uuid, admin=caller.is_admin)
