"""Claims: who owns a piece of durable work, with a fencing token (migration 0015).

A claim is one row `(kind, key)` held by `owner` until `expires_at`, renewed while held.
Acquiring it (free, expired, or released) gives a fresh `epoch` from one sequence, so the
epochs of a key only grow. The owner passes its `Fence` to every state-changing
transaction, which calls `Fence.check(conn)` first: that locks the claim row FOR SHARE and
compares the epoch, so

- a takeover (an UPDATE of the row) waits until that transaction has committed, and
- once taken over, every later transaction of the old owner raises `StaleClaim` and rolls
  back: a zombie (a paused process, an old actor generation, a shard after re-sharding)
  writes nothing, and stops driving when it sees the exception.

Time is the database's clock, so owners on hosts with skewed clocks agree on expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from orchestrator.db import DB_NOW_MS
from orchestrator.errors import Conflict


class StaleClaim(Conflict):
    """The claim is no longer this owner's (taken over, released or deleted): stop."""


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of ownership to present in a transaction."""

    kind: str
    key: str
    owner: str
    epoch: int

    async def check(self, conn: asyncpg.Connection) -> None:
        """In the caller's transaction: the claim is still ours (and stays so until it
        commits). Raises StaleClaim otherwise."""
        held = await conn.fetchval(
            "SELECT 1 FROM claims WHERE kind = $1 AND key = $2 AND epoch = $3 FOR SHARE",
            self.kind,
            self.key,
            self.epoch,
        )
        if held is None:
            raise StaleClaim(
                f"{self.kind} {self.key}: claim epoch {self.epoch} of {self.owner} is stale"
            )

    def join_sql(self, key_expr: str, epoch_param: str) -> str:
        """A JOIN clause (alias `claim`) for a query in the module owning the claimed rows
        that checks the fence in the same statement as its read: no row when the claim is
        not at this epoch. Lock it with `FOR SHARE OF claim` as `check` does."""
        assert self.kind.isidentifier()
        return (
            f" JOIN claims claim ON claim.kind = '{self.kind}' AND claim.key = {key_expr}"
            f" AND claim.epoch = {epoch_param}"
        )

    async def release_in(self, conn: asyncpg.Connection) -> None:
        """Give the claim up in the caller's transaction (the work it guards has ended,
        in the same commit)."""
        await conn.execute(
            "DELETE FROM claims WHERE kind = $1 AND key = $2 AND epoch = $3",
            self.kind,
            self.key,
            self.epoch,
        )


class ClaimStore:
    """The `claims` table. `ttl_ms`: how long a claim lasts without a renewal."""

    def __init__(self, pool: Any, ttl_ms: int) -> None:
        self._pool = pool
        self.ttl_ms = ttl_ms

    async def acquire(self, kind: str, key: str, owner: str) -> Fence | None:
        """Take the claim if it is free or expired (or ours already: a new epoch then too,
        so an earlier driver of the same owner is fenced off); None if another holds it."""
        epoch = await self._pool.fetchval(
            "INSERT INTO claims AS c (kind, key, owner, epoch, expires_at)"
            f" VALUES ($1, $2, $3, nextval('claim_epoch'), {DB_NOW_MS} + $4)"
            " ON CONFLICT (kind, key) DO UPDATE SET owner = EXCLUDED.owner,"
            " epoch = EXCLUDED.epoch, expires_at = EXCLUDED.expires_at"
            f" WHERE c.owner = EXCLUDED.owner OR c.expires_at <= {DB_NOW_MS}"
            " RETURNING epoch",
            kind,
            key,
            owner,
            self.ttl_ms,
        )
        return Fence(kind, key, owner, int(epoch)) if epoch is not None else None

    async def renew(self, fence: Fence) -> None:
        """Extend the claim; StaleClaim when it is no longer ours."""
        renewed = await self._pool.fetchval(
            f"UPDATE claims SET expires_at = {DB_NOW_MS} + $4"
            " WHERE kind = $1 AND key = $2 AND epoch = $3 RETURNING 1",
            fence.kind,
            fence.key,
            fence.epoch,
            self.ttl_ms,
        )
        if renewed is None:
            raise StaleClaim(f"{fence.kind} {fence.key}: lost the claim (epoch {fence.epoch})")

    async def release(self, fence: Fence) -> None:
        """Give the claim up (a no-op when it is not ours any more)."""
        await self._pool.execute(
            "DELETE FROM claims WHERE kind = $1 AND key = $2 AND epoch = $3",
            fence.kind,
            fence.key,
            fence.epoch,
        )

    @staticmethod
    async def revoke_in(conn: asyncpg.Connection, kind: str, key: str) -> int | None:
        """Take the claim from whoever holds it, in the caller's transaction (an override
        acting on what another process drives): its fence fails from now on. The revoked
        epoch, None when nobody held it."""
        epoch = await conn.fetchval(
            "DELETE FROM claims WHERE kind = $1 AND key = $2 RETURNING epoch", kind, key
        )
        return int(epoch) if epoch is not None else None

    async def holder(self, kind: str, key: str) -> tuple[str, int, bool] | None:
        """(owner, epoch, live?) of a claim, None when nobody holds it (tests, status)."""
        row = await self._pool.fetchrow(
            f"SELECT owner, epoch, expires_at > {DB_NOW_MS} AS live FROM claims"
            " WHERE kind = $1 AND key = $2",
            kind,
            key,
        )
        return (row["owner"], int(row["epoch"]), bool(row["live"])) if row is not None else None

    @staticmethod
    def unclaimed_sql(kind: str, key_expr: str, owner_param: str | None = None) -> str:
        """A SQL condition, for a query in the module owning the claimed rows: no live claim
        of `kind` on `key_expr` (but for one of the owner in `owner_param`, e.g. `$4`: a
        restarted actor takes its predecessor's claims back at once). `kind` is a constant
        of ours, never user input."""
        assert kind.isidentifier()
        mine = f" AND c.owner <> {owner_param}" if owner_param else ""
        return (
            f"NOT EXISTS (SELECT 1 FROM claims c WHERE c.kind = '{kind}' AND c.key = {key_expr}"
            f" AND c.expires_at > {DB_NOW_MS}{mine})"
        )
