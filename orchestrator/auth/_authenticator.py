"""Turns an Authorization header into a Principal, with a short per-process cache."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from orchestrator.auth._jwt import JwtVerifier
from orchestrator.auth._principal import Principal
from orchestrator.auth._tokens import TokenStore, hash_token
from orchestrator.errors import ServiceUnavailable, Unauthorized

LOOKUP_TIMEOUT_S = 5.0
NEGATIVE_TTL_S = 2.0
CACHE_MAX = 10_000
# While the LISTEN connection is down, what is cached is served this much longer at most
# (a Postgres outage does not lock out every client at once; nobody can revoke meanwhile
# unless only this replica lost Postgres), and nothing new is cached.
UNWATCHED_GRACE_S = 5.0
# Last use is kept in memory per token and written in one batch this often (per replica), so
# a request never writes to the database and a token's row changes at most once a minute.
LAST_USED_FLUSH_S = 60.0


def _bounded_put(cache: dict[str, Any], key: str, value: Any, limit: int) -> None:
    # Dicts keep insertion order: the oldest entries go first (a hot client re-enters on
    # its next request).
    while len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value


class Authenticator:
    """Verifies bearer tokens.

    Opaque tokens are looked up by hash in Postgres and then served from a per-replica cache,
    so a hot client costs one dict lookup, not a database round trip. With `watch` running
    (every replica runs it), a token changed in `api_tokens` (revoked, deleted) is dropped
    from every replica's cache when its NOTIFY arrives (well within a second). Entries are
    added only while that LISTEN connection is up; when it drops, what is cached is kept at
    most UNWATCHED_GRACE_S more, and the whole cache is dropped when it reconnects, since
    notifications may have been missed meanwhile. `cache_ttl_s` (the longest an entry is
    kept) and `cache_max` bound it as a safety net. Without `watch` (tools, tests), the TTL
    alone bounds how long a revoked token keeps working. An entry never outlives its
    token's expiry. `record_use` (a supervised loop) writes when tokens were last used.
    """

    def __init__(
        self,
        store: TokenStore,
        jwt_verifier: JwtVerifier,
        cache_ttl_s: float,
        cache_max: int = CACHE_MAX,
    ) -> None:
        self._store = store
        self._jwt = jwt_verifier
        self._ttl = cache_ttl_s
        self._max = max(1, cache_max)
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._unknown: dict[str, float] = {}
        self._watched = False  # a `watch` was started: the cache needs its LISTEN
        self._listening = False
        # Bumped by every invalidation: a lookup that raced one does not cache its answer.
        self._epoch = 0
        self._last_used: dict[str, int] = {}  # token hash -> Unix ms, not yet written

    @property
    def listening(self) -> bool:
        """`watch`'s LISTEN connection is up."""
        return self._listening

    @property
    def caching(self) -> bool:
        """Verified tokens are cached now (with `watch`: only while its LISTEN is up)."""
        return self._ttl > 0 and (self._listening or not self._watched)

    async def watch(self, dsn: str) -> None:
        """Keep the cache honest: LISTEN for changed tokens until the connection is lost
        (then raise; run it under the replica's Supervisor, which starts it again)."""
        self._watched = True
        try:
            await self._store.listen(dsn, self._changed, self._connected)
        finally:
            self._listening = False
            self._epoch += 1
            latest = time.monotonic() + UNWATCHED_GRACE_S
            for digest, (expires, principal) in list(self._cache.items()):
                if expires > latest:
                    self._cache[digest] = (latest, principal)

    def _connected(self) -> None:
        # Whatever changed while nobody listened is unknown: start from an empty cache.
        self._drop_all()
        self._listening = True

    def _changed(self, token_hash: str) -> None:
        self.forget([token_hash])

    def _drop_all(self) -> None:
        self._epoch += 1
        self._cache.clear()
        self._unknown.clear()

    async def authenticate(
        self, authorization: str | None, before_lookup: Callable[[], None] | None = None
    ) -> Principal:
        """`before_lookup` runs when the credential is not a recently verified one, before it
        costs a verification (the failed-auth throttle raises there): a client sharing its
        address with a guesser keeps working while its token is cached."""
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Authorization must be 'Bearer <token>'")
        if self._jwt.enabled and JwtVerifier.looks_like_jwt(token):
            if before_lookup is not None:
                before_lookup()
            return await self._jwt.verify(token)
        digest = hash_token(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            self._last_used[digest] = int(time.time() * 1000)
            return cached[1]
        if before_lookup is not None:
            before_lookup()
        if self._unknown.get(digest, 0.0) > now:
            raise Unauthorized("invalid, revoked or expired token")
        epoch = self._epoch
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                found = await self._store.verify(digest)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ServiceUnavailable(
                "cannot verify the token: the token store is unavailable",
                headers={"Retry-After": "5"},
            ) from exc
        if found is None:
            self._cache.pop(digest, None)
            # Remember misses briefly, so garbage tokens cannot each cost a database query.
            _bounded_put(self._unknown, digest, now + NEGATIVE_TTL_S, self._max)
            raise Unauthorized("invalid, revoked or expired token")
        principal, expires_at_ms = found
        wall_ms = int(time.time() * 1000)
        self._last_used[digest] = wall_ms
        # A change notified while we looked may have come after our read: not cached then.
        if self.caching and self._epoch == epoch:
            until = now + self._ttl
            if expires_at_ms is not None:
                # Expiry is a wall-clock time: the entry goes when the token expires.
                until = min(until, now + (expires_at_ms - wall_ms) / 1000)
            _bounded_put(self._cache, digest, (until, principal), self._max)
        return principal

    async def record_use(self, interval_s: float = LAST_USED_FLUSH_S) -> None:
        """Write when tokens were last used every `interval_s`, until cancelled (run it under
        the replica's Supervisor); `flush_last_used` writes what is left at shutdown."""
        while True:
            await asyncio.sleep(interval_s)
            await self.flush_last_used()

    async def flush_last_used(self) -> None:
        pending, self._last_used = self._last_used, {}
        try:
            await self._store.record_use(pending)
        except BaseException:
            # Not lost: merged back (a newer use recorded meanwhile wins) for the next try.
            for digest, at in pending.items():
                if self._last_used.get(digest, 0) < at:
                    self._last_used[digest] = at
            raise

    def forget(self, token_hashes: list[str]) -> None:
        self._epoch += 1
        for digest in token_hashes:
            self._cache.pop(digest, None)
            self._unknown.pop(digest, None)
