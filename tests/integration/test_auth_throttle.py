"""Failed authentications are throttled per client address, before the token lookup, with the
real Redis the replicas share (the app in-process; through HAProxy: tests/e2e/
test_proxy_security.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from orchestrator.auth import TokenStore
from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# 5 failures at once, then one per 60 s: nothing refills while a test runs.
THROTTLE = {"auth_failures_per_address": 5, "auth_failure_window_s": 300}


def _from(source: str, app: ServedApp) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    return httpx.AsyncClient(transport=transport, base_url=f"{app.url}/api/v1", timeout=30)


def _garbage(i: int) -> dict[str, str]:
    return {"Authorization": f"Bearer orch_garbage-{i}"}


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Token hashes looked up in the database (`TokenStore.verify`: the one query the
    authenticator makes for a token it has not verified recently)."""
    seen: list[str] = []
    original = TokenStore.verify

    async def counting(self: TokenStore, token_hash: str) -> Any:
        seen.append(token_hash)
        return await original(self, token_hash)

    monkeypatch.setattr(TokenStore, "verify", counting)
    return seen


async def test_failures_are_throttled_per_address_before_the_lookup(
    make_settings: Callable[..., Any], lookups: list[str]
) -> None:
    # Tokens stay cached for the whole test: the cache is what lets a known one through.
    async with ServedApp(make_settings(**THROTTLE, auth_cache_ttl_s=600)) as app:
        async with httpx.AsyncClient(base_url=f"{app.url}/api/v1") as admin:
            issued = await admin.post("/tokens", headers=ADMIN, json={"user_uuid": "carol"})
            carol = {"Authorization": f"Bearer {issued.json()['token']}"}
        lookups.clear()
        async with _from("127.0.0.7", app) as c:
            assert (await c.get("/whoami", headers=ADMIN)).status_code == 200  # now cached
            lookups.clear()
            codes = [(await c.get("/whoami", headers=_garbage(i))).status_code for i in range(5)]
            assert codes == [401] * 5
            assert len(lookups) == 5
            # A client-written X-Forwarded-For names no other address (no proxy of ours sent it).
            for i in range(5, 10):
                r = await c.get(
                    "/whoami", headers={**_garbage(i), "X-Forwarded-For": f"203.0.113.{i}"}
                )
                assert r.status_code == 429, r.text
            assert r.json()["code"] == "rate_limited"
            assert 55 <= int(r.headers["Retry-After"]) <= 60
            assert len(lookups) == 5, "a throttled request reached the token store"
            # The address is throttled: a good token that would cost a lookup waits too...
            assert (await c.get("/whoami", headers=carol)).status_code == 429
            # ...but one this replica verified recently costs nothing and is answered, so a
            # client sharing the address with a guesser (NAT, a proxy) keeps working.
            assert (await c.get("/whoami", headers=ADMIN)).status_code == 200
            assert len(lookups) == 5
            # Requests without credentials cost no lookup and are not throttled.
            assert (await c.get("/health")).status_code == 200
        async with _from("127.0.0.8", app) as c:
            assert (await c.get("/whoami", headers=_garbage(99))).status_code == 401
            assert (await c.get("/whoami", headers=ADMIN)).status_code == 200


async def test_behind_a_trusted_proxy_the_client_it_names_is_throttled(
    make_settings: Callable[..., Any],
) -> None:
    settings = make_settings(**THROTTLE, trusted_proxies=["127.0.0.9/32"])
    async with ServedApp(settings) as app, _from("127.0.0.9", app) as proxy:
        for i in range(5):
            r = await proxy.get(
                "/whoami", headers={**_garbage(i), "X-Forwarded-For": "10.1.1.1, 203.0.113.5"}
            )
            assert r.status_code == 401
        r = await proxy.get("/whoami", headers={**_garbage(5), "X-Forwarded-For": "203.0.113.5"})
        assert r.status_code == 429
        # Another client behind the same proxy, and the proxy's own address, are not.
        r = await proxy.get("/whoami", headers={**_garbage(6), "X-Forwarded-For": "203.0.113.6"})
        assert r.status_code == 401
        assert (await proxy.get("/whoami", headers=ADMIN)).status_code == 200


async def test_the_bound_holds_across_replicas(make_settings: Callable[..., Any]) -> None:
    settings = make_settings(**THROTTLE)
    async with ServedApp(settings) as one, ServedApp(settings) as two:
        async with _from("127.0.0.10", one) as a, _from("127.0.0.10", two) as b:
            for i in range(3):
                assert (await a.get("/whoami", headers=_garbage(i))).status_code == 401
            for i in range(3, 5):
                assert (await b.get("/whoami", headers=_garbage(i))).status_code == 401
            # The fifth failure (on `two`) emptied the address's bucket shared in Redis.
            assert (await b.get("/whoami", headers=_garbage(5))).status_code == 429
            # `one` has not seen it yet: it lets one more failure through, then blocks too.
            assert (await a.get("/whoami", headers=_garbage(6))).status_code == 401
            assert (await a.get("/whoami", headers=_garbage(7))).status_code == 429
