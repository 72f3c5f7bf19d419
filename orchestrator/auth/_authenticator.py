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


def _bounded_put(cache: dict[str, Any], key: str, value: Any) -> None:
    if len(cache) >= CACHE_MAX:
        cache.clear()  # crude, but bounded; a hot client re-enters on its next request
    cache[key] = value


class Authenticator:
    """Verifies bearer tokens.

    Opaque tokens are looked up by hash in Postgres and cached for `cache_ttl_s`, so a hot
    client costs one dict lookup, not a database round trip; a revoked token stops working
    on every replica within that time (at once on the replica that revoked it).
    """

    def __init__(self, store: TokenStore, jwt_verifier: JwtVerifier, cache_ttl_s: float) -> None:
        self._store = store
        self._jwt = jwt_verifier
        self._ttl = cache_ttl_s
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._unknown: dict[str, float] = {}

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
            return cached[1]
        if before_lookup is not None:
            before_lookup()
        if self._unknown.get(digest, 0.0) > now:
            raise Unauthorized("invalid or revoked token")
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                principal = await self._store.lookup(digest)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ServiceUnavailable(
                "cannot verify the token: the token store is unavailable",
                headers={"Retry-After": "5"},
            ) from exc
        if principal is None:
            self._cache.pop(digest, None)
            # Remember misses briefly, so garbage tokens cannot each cost a database query.
            _bounded_put(self._unknown, digest, now + NEGATIVE_TTL_S)
            raise Unauthorized("invalid or revoked token")
        if self._ttl > 0:
            _bounded_put(self._cache, digest, (now + self._ttl, principal))
        return principal

    def forget(self, token_hashes: list[str]) -> None:
        for digest in token_hashes:
            self._cache.pop(digest, None)
            self._unknown.pop(digest, None)
