"""Optional JWT bearer tokens, for single sign-on: HS256 with a secret, or keys from a JWKS."""

from __future__ import annotations

import asyncio
from typing import Any

import jwt

from orchestrator.auth._principal import Principal
from orchestrator.errors import Unauthorized

_ASYMMETRIC = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]


class JwtVerifier:
    """Verifies JWT bearers. `admin_claim` names the claim whose JSON `true` makes the bearer
    an admin; unset (the default), no JWT is ever an admin."""

    def __init__(
        self,
        *,
        secret: str | None = None,
        jwks_url: str | None = None,
        issuer: str | None = None,
        audience: str | None = None,
        user_claim: str = "sub",
        admin_claim: str | None = None,
    ) -> None:
        self._secret = secret
        # PyJWKClient caches the key set and refetches on an unknown `kid`.
        self._jwks = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300) if jwks_url else None
        self._issuer = issuer
        self._audience = audience
        self._user_claim = user_claim
        self._admin_claim = admin_claim

    @property
    def enabled(self) -> bool:
        return bool(self._secret or self._jwks)

    @staticmethod
    def looks_like_jwt(token: str) -> bool:
        return token.count(".") == 2 and token.startswith("ey")

    async def verify(self, token: str) -> Principal:
        options: Any = {"require": ["exp"], "verify_aud": self._audience is not None}
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") == "HS256" and self._secret:
                key: Any = self._secret
                algorithms = ["HS256"]
            elif self._jwks is not None and header.get("alg") in _ASYMMETRIC:
                # The JWKS fetch is blocking I/O: keep it off the event loop.
                key = (await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)).key
                algorithms = _ASYMMETRIC
            else:
                raise Unauthorized("JWT algorithm not accepted")
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                issuer=self._issuer,
                audience=self._audience,
                options=options,
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid JWT: {exc}") from exc
        user = claims.get(self._user_claim)
        if not isinstance(user, str) or not user:
            raise Unauthorized(f"JWT has no '{self._user_claim}' claim")
        if len(user) > 200 or not user.isprintable():
            raise Unauthorized(f"JWT '{self._user_claim}' claim is not a usable user id")
        # Identities from the identity provider live in their own namespace: a `sub` equal to
        # a token user's id, or to the configured admin ("admin"), is another person there.
        user_uuid = jwt_user_uuid(user)
        # An admin sees every tenant (each user is one), so the identity provider's word on it
        # is trusted only when the operator names the claim, and only as JSON `true`.
        admin = self._admin_claim is not None and claims.get(self._admin_claim) is True
        return Principal(user_uuid, admin, subject=user_uuid)


JWT_NAMESPACE = "jwt:"


def jwt_user_uuid(subject: str) -> str:
    """The user_uuid of a JWT subject (tokens cannot be issued in this namespace)."""
    return f"{JWT_NAMESPACE}{subject}"
