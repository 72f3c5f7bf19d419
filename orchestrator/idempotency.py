"""Idempotent creation (issue 32): a client that sends an `Idempotency-Key` with a creating
POST and retries it (after a timeout, a lost connection) gets the first answer back instead
of a second object.

A key is its caller's (stored under their user_uuid: two users' equal keys are unrelated)
and stands for one request, its fingerprint: a sha256 of the method, the path and the body's
canonical JSON (sorted keys, no spaces), so spacing and key order do not matter. A row goes
through these moves, each one statement:

- claim: the first request with the key inserts a pending row holding its claim's token;
  a request that finds an expired row (`idempotency_ttl_s`) claims it afresh, and one that
  finds a pending row of its own fingerprint whose claimant went quiet for LEASE_S (the
  replica died) takes it over (a new token);
- complete: the answer is recorded where the creation commits: in the creation's own
  transaction when the store offers one (`Answer.in_transaction`), so the object and its
  answer commit together, else just after it. The update is fenced by the token: a claimant
  whose claim was taken over records nothing (inside the creation's transaction: the
  creation rolls back with it, so two claimants never both create);
- release: a request that failed deletes its pending row (nothing was created: its
  transaction rolled back), so the key can be used again, with this body or another;
- purge: expired rows are deleted by the replicas' heartbeat loop (deployments/api.py);
  expiry is also checked whenever a key is read, so a late purge changes nothing.

A second request while the first is pending gets a 409 (`idempotency_key_in_use`, with
Retry-After) rather than waiting for it, as Stripe answers: nothing holds a database
connection or a replica's slot waiting, and the retry then replays the answer
(docs/design-notes.md, "Idempotent creation (issue 32)").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from pydantic import BaseModel

from orchestrator._json import loads
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import Conflict, ValidationFailed

__all__ = [
    "HEADER",
    "IN_USE",
    "LEASE_S",
    "NO_KEY",
    "REPLAYED_HEADER",
    "REUSED",
    "Answer",
    "IdempotencyStore",
    "Replay",
    "check_key",
    "fingerprint",
]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
# The error codes of the two 409s (Stripe's names for the same two cases).
IN_USE = "idempotency_key_in_use"
REUSED = "idempotency_key_reused"
# A pending claim older than this is taken to be dead (its replica went away mid-request)
# and may be taken over by a retry with the same request. A claimant that was only slow
# loses the race, not an object: its fenced completion fails and its creation rolls back
# (for memory: it writes the same entry the retry writes). Creations end far sooner.
LEASE_S = 60
IN_USE_RETRY_AFTER_S = 1
_KEY = re.compile(r"[\x20-\x7e]{1,255}")
# A row that vanished between a claim that found it and the read that follows (released or
# purged meanwhile) is claimed again; past this many rounds something is churning the key.
_CLAIM_ROUNDS = 5

R = TypeVar("R")
A = TypeVar("A", bound=BaseModel)

BeforeCommit = Callable[[asyncpg.Connection, R], Awaitable[None]]


def check_key(raw: str) -> str:
    """The header's value, or a 400 naming the header."""
    if not _KEY.fullmatch(raw):
        message = "1 to 255 printable ASCII characters"
        raise ValidationFailed(
            f"{HEADER}: {message}", extra={"fields": [{"field": HEADER, "message": message}]}
        )
    return raw


def fingerprint(method: str, path: str, body: bytes) -> str:
    """What makes two requests the same one: method, path and the body's canonical JSON (a
    body that is not JSON is taken as its bytes; the routes here refuse one anyway)."""
    try:
        parsed: Any = loads(body) if body else None
        canonical = json.dumps(
            parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    except ValueError:
        canonical = body
    digest = hashlib.sha256(f"{method.upper()} {path}\n".encode())
    digest.update(canonical)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Replay:
    """The first answer to a key, to send again (with `Idempotent-Replayed: true`)."""

    status_code: int
    body: bytes


class _Claim:
    """A key this request holds, by `token`: completed with its answer, or released."""

    def __init__(self, pool: asyncpg.Pool, user_uuid: str, key: str, token: str) -> None:
        self._pool = pool
        self._where = (user_uuid, key, token)
        self.completed = False

    async def complete(
        self, conn: asyncpg.Connection | asyncpg.Pool, status_code: int, body: bytes
    ) -> bool:
        """Record the answer (in `conn`'s transaction when it is one); False when the claim
        was taken over meanwhile (nothing recorded)."""
        done = await conn.fetchval(
            "UPDATE idempotency_keys SET status_code = $4, response = $5"
            " WHERE user_uuid = $1 AND key = $2 AND token = $3 AND status_code IS NULL"
            " RETURNING true",
            *self._where,
            status_code,
            body.decode(),
        )
        self.completed = bool(done)
        return self.completed

    async def release(self) -> None:
        """Free the key after a failure; a completed row (the creation committed, something
        after it failed) stays, so a retry replays it."""
        await self._pool.execute(
            "DELETE FROM idempotency_keys"
            " WHERE user_uuid = $1 AND key = $2 AND token = $3 AND status_code IS NULL",
            *self._where,
        )


class Answer:
    """How an operation run under a key records its answer. A store that creates in a
    transaction of its own takes `in_transaction(make)` as a hook and runs it there, with
    the connection and its result, just before the commit; `make` turns the result into the
    answer the route sends. Without a key the hook is None (nothing to record)."""

    def __init__(self, claim: _Claim | None, status_code: int = 200) -> None:
        self._claim = claim
        self._status = status_code

    def in_transaction(self, make: Callable[[R], BaseModel]) -> BeforeCommit[R] | None:
        claim, status = self._claim, self._status
        if claim is None:
            return None

        async def record(conn: asyncpg.Connection, result: R) -> None:
            if not await claim.complete(conn, status, make(result).model_dump_json().encode()):
                # Raised inside the creation's transaction: it rolls back, and the request
                # that took the key over creates the object (once).
                raise _in_use()

        return record


NO_KEY = Answer(None)


def _in_use() -> Conflict:
    return Conflict(
        f"a request with this {HEADER} is in progress: retry once it has finished",
        code=IN_USE,
        headers={"Retry-After": str(IN_USE_RETRY_AFTER_S)},
        extra={"retry_after": IN_USE_RETRY_AFTER_S},
    )


def _reused(ttl_s: int) -> Conflict:
    return Conflict(
        f"{HEADER}: this key was used for another request (a different body or path) within"
        f" the last {ttl_s} seconds (idempotency_ttl_s): send a new key with a new request",
        code=REUSED,
    )


class IdempotencyStore:
    """The `idempotency_keys` table (migration 0025): claims, answers and their expiry."""

    def __init__(self, pool: asyncpg.Pool, ttl_s: int) -> None:
        self._pool = pool
        self.ttl_s = int(ttl_s)

    async def run(
        self,
        user_uuid: str,
        key: str,
        digest: str,
        operation: Callable[[Answer], Awaitable[A]],
        *,
        status_code: int = 200,
    ) -> A | Replay:
        """`operation` once per (user, key) within the TTL: the first request with the key
        runs it, a retry with the same fingerprint `digest` gets a Replay of its answer, one
        with another fingerprint a 409 (also while the first is still running)."""
        claim = await self._claim(user_uuid, key, digest)
        if isinstance(claim, Replay):
            return claim
        try:
            answer = await operation(Answer(claim, status_code))
            if not claim.completed:
                # A creation with no transaction of its own (a memory store: one statement),
                # recorded after it. If that fails or the claim was lost, the retry that
                # runs it again writes the same entry (docs/design-notes.md).
                await claim.complete(self._pool, status_code, answer.model_dump_json().encode())
        except BaseException:
            # The operation's error is the one to report; a release that fails too (the
            # database gone) leaves the row to its lease.
            with contextlib.suppress(Exception):
                await claim.release()
            raise
        return answer

    async def _claim(self, user_uuid: str, key: str, digest: str) -> _Claim | Replay:
        for _ in range(_CLAIM_ROUNDS):
            token = secrets.token_hex(16)
            claimed = await self._pool.fetchval(
                "INSERT INTO idempotency_keys AS k (user_uuid, key, fingerprint, token,"
                " created_at, locked_until, expires_at)"
                " SELECT $1::text, $2::text, $3::text, $4::text, n, n + $5::bigint,"
                f" n + $6::bigint FROM (SELECT {DB_NOW_MS} AS n) AS now"
                " ON CONFLICT (user_uuid, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,"
                " token = EXCLUDED.token, status_code = NULL, response = NULL,"
                " created_at = EXCLUDED.created_at, locked_until = EXCLUDED.locked_until,"
                " expires_at = EXCLUDED.expires_at"
                # expired: free again; pending and quiet past its lease: taken over
                " WHERE k.expires_at <= EXCLUDED.created_at OR (k.status_code IS NULL"
                " AND k.locked_until <= EXCLUDED.created_at"
                " AND k.fingerprint = EXCLUDED.fingerprint)"
                " RETURNING true",
                user_uuid,
                key,
                digest,
                token,
                LEASE_S * 1000,
                self.ttl_s * 1000,
            )
            if claimed:
                return _Claim(self._pool, user_uuid, key, token)
            # The key is held: by this request's first sending, or by another request.
            row = await self._pool.fetchrow(
                "SELECT fingerprint, status_code, response FROM idempotency_keys"
                f" WHERE user_uuid = $1 AND key = $2 AND expires_at > {DB_NOW_MS}",
                user_uuid,
                key,
            )
            if row is None:
                continue  # released or purged since: claim it again
            if row["fingerprint"] != digest:
                raise _reused(self.ttl_s)
            if row["status_code"] is None:
                raise _in_use()
            return Replay(row["status_code"], row["response"].encode())
        raise _in_use()

    async def purge_expired(self, batch: int = 5000) -> int:
        """Delete up to `batch` expired rows; how many. Rows another replica's purge (or a
        request) holds are skipped: the next round takes them."""
        done = await self._pool.execute(
            "DELETE FROM idempotency_keys AS k USING (SELECT user_uuid, key FROM"
            f" idempotency_keys WHERE expires_at <= {DB_NOW_MS} LIMIT $1 FOR UPDATE SKIP LOCKED) AS"
            " gone WHERE k.user_uuid = gone.user_uuid AND k.key = gone.key",
            batch,
        )
        return int(done.split()[-1])
