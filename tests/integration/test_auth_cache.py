"""The per-replica token cache (issue 17): two authenticators over one real Postgres act as
two replicas; a token revoked or deleted through one stops working on the other within 1 s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from orchestrator.auth import Authenticator, JwtVerifier, TokenStore
from orchestrator.auth._tokens import LISTENER_NAME
from orchestrator.db import Database, connect
from orchestrator.errors import Unauthorized
from tests.conftest import make_supervisor

NO_JWT = JwtVerifier()
REVOCATION_BOUND_S = 1.0


@contextlib.asynccontextmanager
async def replica(database_url: str) -> AsyncIterator[tuple[Database, Authenticator]]:
    """One replica's pool and authenticator, with its token listener running (supervised)."""
    db = await connect(database_url)
    auth = Authenticator(TokenStore(db.pool), NO_JWT, cache_ttl_s=60)
    supervisor = make_supervisor("test-replica")
    supervisor.spawn("token-listener", lambda: auth.watch(database_url))
    try:
        deadline = time.monotonic() + 10
        while not auth.listening:
            assert time.monotonic() < deadline, "the token listener did not connect"
            await asyncio.sleep(0.01)
        yield db, auth
    finally:
        await supervisor.aclose()
        await db.close()


async def rejected_within(auth: Authenticator, header: str, bound_s: float) -> float:
    """Seconds until `auth` rejects `header`; fails past `bound_s`."""
    started = time.monotonic()
    while True:
        try:
            await auth.authenticate(header)
        except Unauthorized:
            return time.monotonic() - started
        assert time.monotonic() - started < bound_s, f"still accepted after {bound_s}s"
        await asyncio.sleep(0.005)


async def served_from_cache(db: Database, auth: Authenticator, header: str) -> bool:
    """True when `auth` answers `header` without the database (its pool is held empty)."""
    conns = [await db.pool.acquire() for _ in range(db.pool.get_max_size())]
    try:
        async with asyncio.timeout(0.5):
            await auth.authenticate(header)
        return True
    except TimeoutError:
        return False
    finally:
        for conn in conns:
            await db.pool.release(conn)


@pytest.mark.parametrize("how", ["revoke", "delete"])
async def test_a_changed_token_stops_working_on_every_replica_within_a_second(
    database_url: str, how: str
) -> None:
    async with replica(database_url) as (db_a, auth_a), replica(database_url) as (db_b, auth_b):
        store = TokenStore(db_a.pool)
        issued = await store.create("alice", admin=False)
        header = f"Bearer {issued.token}"
        for auth in (auth_a, auth_b):
            assert (await auth.authenticate(header)).user_uuid == "alice"
        # Both replicas now answer from their caches, not from Postgres.
        assert await served_from_cache(db_b, auth_b, header)
        if how == "revoke":
            assert await store.revoke(issued.prefix) != []  # replica A's API does this
        else:
            await db_a.pool.execute("DELETE FROM api_tokens WHERE prefix = $1", issued.prefix)
        # Replica B was not told by anyone but Postgres.
        elapsed = await rejected_within(auth_b, header, REVOCATION_BOUND_S)
        assert elapsed < REVOCATION_BOUND_S
        # Replica A hears it the same way (a bare TokenStore does not drop A's cache itself):
        # on a loaded machine its notification may land a moment after B's.
        assert await rejected_within(auth_a, header, REVOCATION_BOUND_S) < REVOCATION_BOUND_S


async def test_the_cache_is_dropped_when_the_listener_reconnects(database_url: str) -> None:
    """Notifications sent while a replica's LISTEN connection is down are lost: the replica
    drops its whole cache when it reconnects (and caches nothing new while it is down)."""
    async with replica(database_url) as (db, auth):
        store = TokenStore(db.pool)
        issued = await store.create("bob", admin=False)
        header = f"Bearer {issued.token}"
        await auth.authenticate(header)
        assert await served_from_cache(db, auth, header)
        # Cut the listener's connection from the server side, and revoke before it is back.
        cut = await db.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1 AND datname = current_database()",
            LISTENER_NAME,
        )
        assert cut >= 1
        await store.revoke(issued.prefix)
        await rejected_within(auth, header, REVOCATION_BOUND_S)
        deadline = time.monotonic() + 10
        while not auth.listening:
            assert time.monotonic() < deadline, "the token listener did not come back"
            await asyncio.sleep(0.01)
        with pytest.raises(Unauthorized):
            await auth.authenticate(header)


async def test_the_cache_is_bounded(database_url: str) -> None:
    db = await connect(database_url)
    try:
        store = TokenStore(db.pool)
        auth = Authenticator(store, NO_JWT, cache_ttl_s=60, cache_max=3)
        headers = [f"Bearer {(await store.create(f'u{i}', admin=False)).token}" for i in range(5)]
        for header in headers:
            await auth.authenticate(header)
        assert await served_from_cache(db, auth, headers[-1])
        assert not await served_from_cache(db, auth, headers[0])  # the oldest went first
    finally:
        await db.close()
