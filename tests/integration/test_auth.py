"""Tokens, JWTs and the rate limit against the real Postgres and Redis."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
import redis.asyncio as aioredis
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from orchestrator.auth import (
    Authenticator,
    JwtVerifier,
    RateLimiter,
    TokenStore,
    hash_token,
    token_prefix,
)
from orchestrator.db import connect
from orchestrator.errors import RateLimited, Unauthorized

NO_JWT = JwtVerifier()
SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret-0123"


async def test_token_lifecycle(database_url: str) -> None:
    db = await connect(database_url)
    try:
        store = TokenStore(db.pool)
        issued = await store.create("alice", admin=False)
        stored = await db.pool.fetchval(
            "SELECT token_hash FROM api_tokens WHERE prefix = $1", issued.prefix
        )
        assert stored == hash_token(issued.token) and issued.token not in stored
        auth = Authenticator(store, NO_JWT, cache_ttl_s=60)
        principal = await auth.authenticate(f"Bearer {issued.token}")
        assert (principal.user_uuid, principal.is_admin) == ("alice", False)
        # Someone else cannot revoke it; its owner can.
        assert await store.revoke(issued.prefix, owner="mallory") == []
        revoked = await store.revoke(issued.prefix, owner="alice")
        assert revoked == [hash_token(issued.token)]
        # Cached on this authenticator until told to forget.
        auth.forget(revoked)
        with pytest.raises(Unauthorized):
            await auth.authenticate(f"Bearer {issued.token}")
        with pytest.raises(Unauthorized):
            await Authenticator(store, NO_JWT, 0).authenticate(f"Bearer {issued.token}")
    finally:
        await db.close()


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer", "Bearer orch_unknown"])
async def test_bad_headers(database_url: str, header: str | None) -> None:
    db = await connect(database_url)
    try:
        with pytest.raises(Unauthorized):
            await Authenticator(TokenStore(db.pool), NO_JWT, 0).authenticate(header)
    finally:
        await db.close()


async def test_configured_admin_token(database_url: str) -> None:
    first, second = "orch_" + "a" * 40, "orch_" + "b" * 40
    db = await connect(database_url)
    try:
        store = TokenStore(db.pool)
        await store.register_configured_admin(first)
        await store.register_configured_admin(first)
        principal = await store.lookup(hash_token(first))
        assert principal is not None and principal.is_admin and principal.user_uuid == "admin"
        assert await db.pool.fetchval("SELECT count(*) FROM api_tokens") == 1
        # A revoked admin token stays revoked across restarts (re-registration).
        assert await store.revoke(token_prefix(first)) == [hash_token(first)]
        await store.register_configured_admin(first)
        assert await store.lookup(hash_token(first)) is None
        # Configuring a new one revokes any earlier configured token.
        await db.pool.execute("UPDATE api_tokens SET revoked_at = NULL")
        await store.register_configured_admin(second)
        assert await store.lookup(hash_token(first)) is None
        assert await store.lookup(hash_token(second)) is not None
        # Tokens issued through the API are untouched by that.
        issued = await store.create("alice", admin=False)
        await store.register_configured_admin(second)
        assert await store.lookup(hash_token(issued.token)) is not None
    finally:
        await db.close()


async def test_hs256_jwt(database_url: str) -> None:
    verifier = JwtVerifier(secret=SECRET, audience="orch", user_claim="sub", admin_claim="admin")
    ok = jwt.encode(
        {"sub": "bob", "admin": True, "aud": "orch", "exp": time.time() + 60},
        SECRET,
        algorithm="HS256",
    )
    principal = await verifier.verify(ok)
    assert principal.user_uuid == "jwt:bob" and principal.is_admin
    # Unless the operator names the admin claim, no JWT is an admin.
    assert not (await JwtVerifier(secret=SECRET, audience="orch").verify(ok)).is_admin
    for bad in (
        jwt.encode({"sub": "bob", "aud": "orch", "exp": time.time() - 5}, SECRET),
        jwt.encode({"sub": "bob", "aud": "other", "exp": time.time() + 60}, SECRET),
        jwt.encode({"sub": "bob", "aud": "orch", "exp": time.time() + 60}, "wrong-" + SECRET),
        jwt.encode({"sub": "bob", "aud": "orch"}, SECRET),
    ):
        with pytest.raises(Unauthorized):
            await verifier.verify(bad)


class _JwksServer:
    """A real JWKS endpoint on loopback, as an identity provider serves it."""

    def __init__(self, jwks: dict) -> None:
        body = json.dumps(jwks).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/keys"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_rs256_jwt_from_jwks() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    public.update(kid="k1", use="sig", alg="RS256")
    server = _JwksServer({"keys": [public]})
    try:
        verifier = JwtVerifier(
            jwks_url=server.url, issuer="https://idp.test", user_claim="oid", admin_claim="is_admin"
        )
        claims = {
            "oid": "u-42",
            "is_admin": False,
            "iss": "https://idp.test",
            "exp": time.time() + 60,
        }
        token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
        principal = await verifier.verify(token)
        assert principal.user_uuid == "jwt:u-42" and not principal.is_admin
        wrong_iss = jwt.encode(
            {**claims, "iss": "https://evil"}, key, algorithm="RS256", headers={"kid": "k1"}
        )
        with pytest.raises(Unauthorized):
            await verifier.verify(wrong_iss)
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode(claims, other, algorithm="RS256", headers={"kid": "k1"})
        with pytest.raises(Unauthorized):
            await verifier.verify(forged)
    finally:
        server.close()


async def test_rate_limit_in_redis(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        limiter = RateLimiter(client, per_minute=3, namespace="rl-test")
        now = 1_800_000_010.0
        assert [await limiter.hit("tok", now) for _ in range(3)] == [2, 1, 0]
        with pytest.raises(RateLimited) as info:
            await limiter.hit("tok", now)
        assert 1 <= info.value.extra["retry_after"] <= 61
        # Another credential has its own budget; the next minute starts afresh.
        assert await limiter.hit("other", now) == 2
        assert await limiter.hit("tok", now + 60) == 2
        assert 0 < await client.ttl(f"rl-test:tok:{int(now // 60)}") <= 120
    finally:
        await client.aclose()


async def test_hs256_refused_when_only_a_jwks_is_trusted() -> None:
    verifier = JwtVerifier(jwks_url="http://127.0.0.1:9/keys")
    forged = jwt.encode(
        {"sub": "mallory", "admin": True, "exp": time.time() + 60}, SECRET, algorithm="HS256"
    )
    with pytest.raises(Unauthorized, match="algorithm"):
        await verifier.verify(forged)


async def test_garbage_tokens_are_remembered_briefly(database_url: str) -> None:
    db = await connect(database_url)
    try:
        store = TokenStore(db.pool)
        auth = Authenticator(store, NO_JWT, cache_ttl_s=5)
        with pytest.raises(Unauthorized):
            await auth.authenticate("Bearer orch_not-a-token")
        # Closing the pool proves the second miss is answered without the database.
        await db.pool.close()
        with pytest.raises(Unauthorized):
            await auth.authenticate("Bearer orch_not-a-token")
    finally:
        await db.close()
