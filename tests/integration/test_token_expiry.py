"""Tokens with an expiry (issue 20): refused at expiry everywhere, including by a replica
that has the token cached; and when each token was last used, recorded without a database
write per request and without dropping the token from the replicas' caches."""

from __future__ import annotations

import asyncio
import time

import httpx

from orchestrator.auth import TokenInfo, TokenStore, hash_token
from orchestrator.errors import Unauthorized
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.integration.test_auth_cache import (
    REVOCATION_BOUND_S,
    rejected_within,
    replica,
    served_from_cache,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# How late after its expiry a token may still be answered (the polling step, a loaded box).
EXPIRY_SLACK_S = 0.5


async def alices(store: TokenStore) -> TokenInfo:
    (info,) = [t for t in await store.list_tokens(include_revoked=True) if t.user_uuid == "alice"]
    return info


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_an_expired_token_is_a_401_without_a_restart(make_settings) -> None:
    # A long cache TTL: only the token's expiry can end its cached entry in time.
    settings = make_settings(auth_cache_ttl_s=300)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        before = now_ms()
        r = await c.post(
            "/api/v1/tokens", headers=ADMIN, json={"user_uuid": "alice", "expires_in": 2}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert before + 2000 <= body["expires_at"] <= now_ms() + 2000
        as_alice = {"Authorization": f"Bearer {body['token']}"}
        r = await c.get("/api/v1/whoami", headers=as_alice)
        assert r.status_code == 200 and r.json()["user_uuid"] == "alice"  # now cached
        while True:
            r = await c.get("/api/v1/whoami", headers=as_alice)
            if r.status_code == 401:
                break
            assert r.status_code == 200
            assert now_ms() < body["expires_at"] + EXPIRY_SLACK_S * 1000, "served after expiry"
            await asyncio.sleep(0.02)
        assert now_ms() >= body["expires_at"], "refused before its expiry"
        assert r.json()["code"] == "unauthorized" and r.json()["ok"] is False

        # expires_at (Unix ms) works too; a token without either never expires.
        at = now_ms() + 3_600_000
        r = await c.post(
            "/api/v1/tokens", headers=ADMIN, json={"user_uuid": "bob", "expires_at": at}
        )
        assert r.status_code == 200 and r.json()["expires_at"] == at
        r = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "carol"})
        assert r.status_code == 200 and r.json()["expires_at"] is None
        # Bad expiries are 400s naming the field.
        for bad, field in (
            ({"expires_in": 0}, "expires_in"),
            ({"expires_in": "soon"}, "expires_in"),
            ({"expires_at": now_ms() - 1000}, "expires_at"),
        ):
            r = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "d", **bad})
            assert r.status_code == 400, (bad, r.text)
            assert field in {f["field"] for f in r.json()["fields"]}, r.json()
        r = await c.post(
            "/api/v1/tokens",
            headers=ADMIN,
            json={"user_uuid": "d", "expires_in": 60, "expires_at": now_ms() + 60_000},
        )
        assert r.status_code == 400 and r.json()["code"] == "validation_error"


async def test_a_cached_entry_does_not_outlive_the_token(database_url: str) -> None:
    async with replica(database_url) as (db, auth):
        store = TokenStore(db.pool)
        issued = await store.create("alice", admin=False, expires_at=now_ms() + 1500)
        header = f"Bearer {issued.token}"
        assert (await auth.authenticate(header)).user_uuid == "alice"
        assert await served_from_cache(db, auth, header)
        while True:
            try:
                await auth.authenticate(header)
            except Unauthorized:
                break
            assert now_ms() < (issued.expires_at or 0) + EXPIRY_SLACK_S * 1000
            await asyncio.sleep(0.01)
        assert now_ms() >= (issued.expires_at or 0)


async def test_last_use_is_written_in_batches_and_keeps_the_cache(database_url: str) -> None:
    async with replica(database_url) as (db, auth):
        store = TokenStore(db.pool)
        issued = await store.create("alice", admin=False)
        header = f"Bearer {issued.token}"
        other = await store.create("bob", admin=False)
        await auth.authenticate(f"Bearer {other.token}")
        before = now_ms()
        for _ in range(5):
            await auth.authenticate(header)
        # Nothing is written per request.
        assert (await alices(store)).last_used_at is None
        await auth.flush_last_used()
        info = await alices(store)
        assert info.last_used_at is not None and before <= info.last_used_at <= now_ms()
        # Recording last use changes the row but notifies no replica: still cached. (Bob's
        # revocation is notified after it: once it has arrived, Alice's would have too.)
        await store.revoke(other.prefix)
        await rejected_within(auth, f"Bearer {other.token}", REVOCATION_BOUND_S)
        assert await served_from_cache(db, auth, header)
        # A time never moves back (another replica may have written a later one).
        await store.record_use({hash_token(issued.token): before - 60_000})
        assert (await alices(store)).last_used_at == info.last_used_at
