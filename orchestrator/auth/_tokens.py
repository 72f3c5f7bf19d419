"""Opaque API tokens: random, shown once, stored as a sha256 hash."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from orchestrator.auth._principal import Principal
from orchestrator.errors import ValidationFailed

TOKEN_PREFIX = "orch_"
PREFIX_LEN = 12  # characters of the token kept in clear to name it (e.g. for revocation)


# Migration 0017: every update or delete of a token row sends its hash here, at commit.
NOTIFY_CHANNEL = "orch_tokens"
# How often the LISTEN connection is probed: a connection dead without a FIN (a partition)
# is noticed within this plus the probe's timeout, and the caches dropped.
LISTEN_PROBE_S = 2.0
LISTEN_PROBE_TIMEOUT_S = 5.0  # generous: a busy server is not a dead connection
LISTENER_NAME = "orch-token-listener"  # its application_name, as pg_stat_activity shows it

ADMIN_USER = "admin"  # the user_uuid of the configured admin token
RESERVED_PREFIX = "jwt:"  # JWT identities (orchestrator/auth/_jwt.py)


def check_token_user(user_uuid: str, admin: bool) -> None:
    """Tokens never act in another authenticator's namespace, and `admin` (the configured
    admin's tenant) is only ever an admin."""
    if user_uuid.lower().startswith(RESERVED_PREFIX):
        raise ValidationFailed(
            f"user_uuid: '{RESERVED_PREFIX}' is reserved for JWT identities",
            extra={"fields": [{"field": "user_uuid", "message": "reserved namespace"}]},
        )
    if user_uuid == ADMIN_USER and not admin:
        raise ValidationFailed(
            f"user_uuid: '{ADMIN_USER}' is the configured admin: only an admin token acts as it",
            extra={"fields": [{"field": "user_uuid", "message": "reserved for admin tokens"}]},
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_prefix(token: str) -> str:
    return token[:PREFIX_LEN]


@dataclass(frozen=True)
class IssuedToken:
    token: str
    prefix: str
    user_uuid: str
    admin: bool
    expires_at: int | None = None  # Unix ms; None = never


@dataclass(frozen=True)
class TokenInfo:
    """What may be shown about a token: never the token or its hash."""

    prefix: str
    user_uuid: str
    admin: bool
    kind: str
    description: str
    created_at: int  # Unix ms, like the other times here
    last_used_at: int | None
    expires_at: int | None
    revoked_at: int | None


class TokenStore:
    """The `api_tokens` table."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self,
        user_uuid: str,
        admin: bool,
        description: str = "",
        conn: asyncpg.Connection | None = None,
        *,
        expires_at: int | None = None,
    ) -> IssuedToken:
        """Issue a token (valid until `expires_at`, Unix ms, when given); on `conn` when
        given (the caller's transaction)."""
        check_token_user(user_uuid, admin)
        now = _now_ms()
        if expires_at is not None and expires_at <= now:
            raise ValidationFailed(
                "expires_at: must be in the future",
                extra={"fields": [{"field": "expires_at", "message": "must be in the future"}]},
            )
        token = generate_token()
        await (conn or self._pool).execute(
            """INSERT INTO api_tokens (token_hash, prefix, user_uuid, is_admin, description,
                                       created_at, expires_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7)""",
            hash_token(token),
            token_prefix(token),
            user_uuid,
            admin,
            description,
            now,
            expires_at,
        )
        return IssuedToken(token, token_prefix(token), user_uuid, admin, expires_at)

    async def register_configured_admin(self, token: str) -> None:
        """Make the configured admin token (`admin_token`) the one configured admin token.

        Idempotent, and it never brings back a token that was revoked: an operator who revokes
        it must configure a new one. A token configured earlier and since replaced is revoked.
        """
        digest = hash_token(token)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """UPDATE api_tokens SET revoked_at = $2
                   WHERE kind = 'configured' AND token_hash <> $1 AND revoked_at IS NULL""",
                digest,
                _now_ms(),
            )
            await conn.execute(
                """INSERT INTO api_tokens (token_hash, prefix, user_uuid, is_admin, description,
                                           created_at, kind)
                   VALUES ($1, $2, $3, true, 'configured admin token', $4, 'configured')
                   ON CONFLICT (token_hash) DO NOTHING""",
                digest,
                token_prefix(token),
                ADMIN_USER,
                _now_ms(),
            )

    async def verify(self, token_hash: str) -> tuple[Principal, int | None] | None:
        """The live token's principal and its expiry (Unix ms, None = never); None when it
        is unknown, revoked or expired."""
        row = await self._pool.fetchrow(
            "SELECT user_uuid, is_admin, expires_at FROM api_tokens"
            " WHERE token_hash = $1 AND revoked_at IS NULL"
            " AND (expires_at IS NULL OR expires_at > $2)",
            token_hash,
            _now_ms(),
        )
        if row is None:
            return None
        return Principal(row["user_uuid"], row["is_admin"], subject=token_hash), row["expires_at"]

    async def lookup(self, token_hash: str) -> Principal | None:
        found = await self.verify(token_hash)
        return None if found is None else found[0]

    async def list_tokens(self, *, include_revoked: bool = False) -> list[TokenInfo]:
        """Every token, oldest first (live ones only unless `include_revoked`)."""
        rows = await self._pool.fetch(
            """SELECT prefix, user_uuid, is_admin, kind, description, created_at, last_used_at,
                      expires_at, revoked_at
               FROM api_tokens WHERE $1 OR revoked_at IS NULL
               ORDER BY created_at, prefix""",
            include_revoked,
        )
        return [
            TokenInfo(
                prefix=r["prefix"],
                user_uuid=r["user_uuid"],
                admin=r["is_admin"],
                kind=r["kind"],
                description=r["description"],
                created_at=r["created_at"],
                last_used_at=r["last_used_at"],
                expires_at=r["expires_at"],
                revoked_at=r["revoked_at"],
            )
            for r in rows
        ]

    async def record_use(self, last_used: dict[str, int]) -> None:
        """Record when tokens (by hash) were last used, in one statement; a time never moves
        back (another replica may have written a later one). Migration 0018 keeps this from
        notifying the replicas' caches."""
        if not last_used:
            return
        await self._pool.execute(
            """UPDATE api_tokens t SET last_used_at = u.at
               FROM unnest($1::text[], $2::bigint[]) AS u(token_hash, at)
               WHERE t.token_hash = u.token_hash
                 AND (t.last_used_at IS NULL OR t.last_used_at < u.at)""",
            list(last_used),
            list(last_used.values()),
        )

    async def revoke(self, prefix: str, *, owner: str | None = None) -> list[str]:
        """Revoke live tokens with this prefix (only `owner`'s when given); return their hashes."""
        rows = await self._pool.fetch(
            """UPDATE api_tokens SET revoked_at = $3
               WHERE prefix = $1 AND revoked_at IS NULL AND ($2::text IS NULL OR user_uuid = $2)
               RETURNING token_hash""",
            prefix,
            owner,
            _now_ms(),
        )
        return [r["token_hash"] for r in rows]

    async def listen(
        self, dsn: str, on_change: Callable[[str], None], on_connected: Callable[[], None]
    ) -> None:
        """LISTEN for changed tokens on a connection of its own: `on_connected()` once the
        LISTEN is in place, then `on_change(token_hash)` per changed row. Raises when the
        connection is lost (the caller's supervisor starts it again)."""
        conn = await asyncpg.connect(
            dsn, timeout=5, server_settings={"application_name": LISTENER_NAME}
        )
        closed = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _conn: closed.set())
            await conn.add_listener(
                NOTIFY_CHANNEL, lambda _conn, _pid, _channel, payload: on_change(payload)
            )
            on_connected()
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTEN_PROBE_S):
                        await closed.wait()
                if closed.is_set():
                    raise ConnectionError("the token listener's connection closed")
                async with asyncio.timeout(LISTEN_PROBE_TIMEOUT_S):
                    await conn.fetchval("SELECT 1")
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
