"""Who may call a channel's webhook receiver: each platform's own proof (SPEC part 5 rule 5).

- Slack: the v0 request signature, HMAC-SHA256 of `v0:<timestamp>:<raw body>` keyed with the
  app's signing secret, in `X-Slack-Signature`; `X-Slack-Request-Timestamp` more than five
  minutes from now (either way) is a replay.
- Teams (Bot Framework): an RS256 JWT in `Authorization: Bearer`, signed by a key from the
  Bot Framework JWKS, with the expected issuer and audience (the bot's app id), and the
  activity's `channelId` among that key's `endorsements` (a key Microsoft endorses for one
  channel cannot vouch for activities of another).
- Telegram: the source address inside an allowlist of ranges, and, when the bot's webhook was
  set with a `secret_token`, the `X-Telegram-Bot-Api-Secret-Token` header equal to it.

Every failure raises `VerificationFailed` (401) with a message naming the check that failed;
messages never carry a secret, a signature or a token. Header lookups are case-insensitive:
pass Starlette's `Headers`, a dict with lower-case names (as ASGI gives them), or any mapping.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import re
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jwt

from orchestrator.errors import ServiceUnavailable, Unauthorized

__all__ = [
    "SLACK_SIGNATURE_VERSION",
    "TeamsVerifier",
    "TeamsVerifiers",
    "VerificationFailed",
    "parse_cidrs",
    "slack_signature",
    "teams_channel_id",
    "verify_slack",
    "verify_teams_service_url",
    "verify_telegram",
]

SLACK_SIGNATURE_VERSION = "v0"
_TIMESTAMP = re.compile(r"\d{1,15}")
_ALG_NAME = re.compile(r"[A-Za-z0-9]{1,16}")  # echoed in errors: nothing else from a token

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class VerificationFailed(Unauthorized):
    """A webhook request did not prove it comes from the platform: 401, nothing relayed."""

    def __init__(self, message: str = "webhook verification failed", **kw: Any) -> None:
        # Not a bearer-token challenge: the platform, not a user, is the caller.
        kw.setdefault("headers", {})
        super().__init__(message, **kw)


def header(headers: Mapping[str, str], name: str) -> str | None:
    """`name` (lower-case) from `headers`, whatever the case of the mapping's keys."""
    value = headers.get(name)
    if value is not None:
        return value
    for key, candidate in headers.items():
        if key.lower() == name:
            return candidate
    return None


def _same(given: str, expected: str) -> bool:
    # compare_digest wants ASCII str or bytes; header values can hold anything.
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


# --- Slack ---------------------------------------------------------------------------------


def slack_signature(signing_secret: str, timestamp: str, body: bytes) -> str:
    """`v0=<hex>`: what Slack puts in `X-Slack-Signature` for this timestamp and raw body."""
    base = f"{SLACK_SIGNATURE_VERSION}:{timestamp}:".encode() + body
    digest = hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    return f"{SLACK_SIGNATURE_VERSION}={digest}"


def verify_slack(
    signing_secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: int = 300,
) -> None:
    """Slack's request signing, as documented: reject a timestamp that is not an integer or is
    more than `tolerance_s` from `now` (replay), then compare `v0=HMAC-SHA256(secret,
    "v0:<timestamp>:<raw body>")` with `X-Slack-Signature` in constant time. `body` must be
    the bytes as received, before any JSON or form parsing."""
    if not signing_secret:
        raise VerificationFailed("slack signature: the channel has no signing secret")
    timestamp = header(headers, "x-slack-request-timestamp")
    if timestamp is None:
        raise VerificationFailed("slack signature: missing X-Slack-Request-Timestamp header")
    signature = header(headers, "x-slack-signature")
    if signature is None:
        raise VerificationFailed("slack signature: missing X-Slack-Signature header")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise VerificationFailed("slack signature: X-Slack-Request-Timestamp is not an integer")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance_s:
        raise VerificationFailed(
            f"slack signature: stale timestamp (more than {tolerance_s} s from the server's "
            "clock); a replayed request is refused"
        )
    if not signature.startswith(f"{SLACK_SIGNATURE_VERSION}="):
        raise VerificationFailed(
            f"slack signature: unsupported signature version (expected "
            f"{SLACK_SIGNATURE_VERSION}=...)"
        )
    if not _same(signature, slack_signature(signing_secret, timestamp, body)):
        raise VerificationFailed("slack signature: signature does not match the request body")


# --- Teams (Bot Framework) -----------------------------------------------------------------


class _EndorsingJWKClient(jwt.PyJWKClient):
    """PyJWKClient that also keeps each key's `endorsements` (the channels Microsoft signs
    with it), read from the same fetch that fills the key cache."""

    def __init__(self, uri: str, **kw: Any) -> None:
        super().__init__(uri, **kw)
        self.endorsements: dict[str, frozenset[str]] = {}

    def fetch_data(self) -> Any:
        data = super().fetch_data()
        keys = data.get("keys") if isinstance(data, dict) else None
        found: dict[str, frozenset[str]] = {}
        for entry in keys if isinstance(keys, list) else ():
            if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
                continue
            listed = entry.get("endorsements")
            names = listed if isinstance(listed, list) else ()
            found[entry["kid"]] = frozenset(n for n in names if isinstance(n, str))
        self.endorsements = found
        return data


def teams_channel_id(raw: bytes) -> str | None:
    """The `channelId` of a Bot Framework activity body, None when it has none (or the body is
    not a JSON object): read before the token is checked, so nothing else is trusted yet."""
    try:
        activity = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    channel_id = activity.get("channelId") if isinstance(activity, dict) else None
    return channel_id if isinstance(channel_id, str) and channel_id else None


class TeamsVerifier:
    """Checks the Bot Framework JWT on a Teams-style webhook request.

    RS256 only; the key is the JWKS entry named by the token's `kid`. The key set is cached
    for `cache_s`; a `kid` not in the cached set makes PyJWKClient fetch the set once more
    (key rotation), at most once per `refetch_cooldown_s`, so a stream of forged `kid`s cannot
    turn every request into a JWKS fetch. `exp` is required; `nbf`/`iat`/`exp` are checked
    with `leeway_s` of clock skew (Bot Framework documents five minutes). `iss` must equal
    `issuer`; `aud` must equal `audience` (the bot's Microsoft app id). With `audience=None`
    the audience is NOT checked: any bot's token from the issuer passes, so operators must set
    it in production. The activity's `channelId` must be listed in the signing key's
    `endorsements` in the JWKS (Bot Framework's authentication rules); a key without
    endorsements vouches for no channel.

    A JWKS that cannot be fetched (network, HTTP error, not a key set) raises
    `ServiceUnavailable` (503) rather than 401: the sender did nothing wrong and Bot Framework
    retries a 5xx delivery.
    """

    ALGORITHMS = ("RS256",)

    def __init__(
        self,
        jwks_url: str,
        issuer: str,
        audience: str | None,
        *,
        cache_s: int = 3600,
        leeway_s: int = 300,
        refetch_cooldown_s: float = 30.0,
        fetch_timeout_s: float = 10.0,
    ) -> None:
        # `cooldown_duration` needs PyJWT >= 2.14.
        self._jwks = _EndorsingJWKClient(
            jwks_url,
            cache_jwk_set=True,
            lifespan=cache_s,
            timeout=fetch_timeout_s,
            cooldown_duration=refetch_cooldown_s,
        )
        self.jwks_url = jwks_url
        self.issuer = issuer
        self.audience = audience
        self.leeway_s = leeway_s

    def __repr__(self) -> str:
        return f"TeamsVerifier(issuer={self.issuer!r}, audience={self.audience!r})"

    async def verify(self, authorization: str | None, channel_id: str | None) -> dict[str, Any]:
        """The token's claims, once every check passed. `channel_id` is the activity's
        `channelId` (`teams_channel_id`); None is refused."""
        token = self._bearer(authorization)
        try:
            unverified = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise VerificationFailed("teams token: malformed JWT") from exc
        alg = unverified.get("alg")
        if alg not in self.ALGORITHMS:
            shown = alg if isinstance(alg, str) and _ALG_NAME.fullmatch(alg) else "?"
            raise VerificationFailed(f"teams token: algorithm {shown} not accepted (RS256 only)")
        kid = unverified.get("kid")
        if not isinstance(kid, str) or not kid:
            raise VerificationFailed("teams token: no key id (kid) in the JWT header")
        key = await self._signing_key(kid)
        if key.algorithm_name not in self.ALGORITHMS:
            raise VerificationFailed("teams token: the JWKS key for this kid is not an RSA key")
        claims = self._decode(token, key.key)
        # After the signature: an unsigned token learns nothing about the key's endorsements.
        if channel_id is None:
            raise VerificationFailed("teams activity: no channelId to check the endorsements of")
        if channel_id not in self._jwks.endorsements.get(kid, frozenset()):
            raise VerificationFailed(
                "teams token: the signing key is not endorsed for the activity's channelId"
            )
        return claims

    @staticmethod
    def _bearer(authorization: str | None) -> str:
        if not authorization:
            raise VerificationFailed("teams token: missing Authorization header")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise VerificationFailed("teams token: Authorization is not a Bearer token")
        token = token.strip()
        if not token:
            raise VerificationFailed("teams token: empty Bearer token")
        return token

    async def _signing_key(self, kid: str) -> jwt.PyJWK:
        # PyJWKClient does blocking urllib I/O (and holds a lock while it does): off the loop.
        try:
            await asyncio.to_thread(self._jwks.get_signing_keys)
        except (jwt.PyJWTError, ValueError) as exc:  # ValueError: the body is not JSON
            raise ServiceUnavailable(
                "teams token: the signing keys (JWKS) could not be fetched; retry later"
            ) from exc
        try:
            return await asyncio.to_thread(self._jwks.get_signing_key, kid)
        except jwt.PyJWKClientConnectionError as exc:  # the refetch for an unknown kid failed
            raise ServiceUnavailable(
                "teams token: the signing keys (JWKS) could not be fetched; retry later"
            ) from exc
        except (jwt.PyJWTError, ValueError) as exc:
            raise VerificationFailed(
                "teams token: unknown signing key (kid not in the JWKS)"
            ) from exc

    def _decode(self, token: str, key: Any) -> dict[str, Any]:
        required = ["exp", "iss"] + (["aud"] if self.audience is not None else [])
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=list(self.ALGORITHMS),
                issuer=self.issuer,
                audience=self.audience,
                leeway=self.leeway_s,
                options={"require": required, "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError as exc:
            raise VerificationFailed("teams token: expired (exp)") from exc
        except jwt.ImmatureSignatureError as exc:
            raise VerificationFailed("teams token: not yet valid (nbf/iat)") from exc
        except jwt.InvalidIssuerError as exc:
            raise VerificationFailed("teams token: wrong issuer (iss)") from exc
        except jwt.InvalidAudienceError as exc:
            raise VerificationFailed("teams token: wrong audience (aud)") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise VerificationFailed(f"teams token: missing {exc.claim} claim") from exc
        except jwt.InvalidSignatureError as exc:
            raise VerificationFailed("teams token: signature does not verify") from exc
        except (jwt.InvalidAlgorithmError, jwt.InvalidKeyError) as exc:
            raise VerificationFailed("teams token: key and algorithm do not match") from exc
        except jwt.PyJWTError as exc:
            raise VerificationFailed("teams token: malformed JWT") from exc
        return claims


def verify_teams_service_url(claims: Mapping[str, Any], service_url: str | None) -> None:
    """Bot Framework's last check: the token's `serviceurl` claim, when present, names the
    activity's `serviceUrl` (so a token cannot be replayed with another reply address)."""
    claimed = claims.get("serviceurl") or claims.get("serviceUrl")
    if claimed is None:
        return
    if (
        not isinstance(claimed, str)
        or not service_url
        or claimed.rstrip("/") != service_url.rstrip("/")
    ):
        raise VerificationFailed("teams token: serviceurl claim does not match the activity")


# --- Telegram ------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _networks(cidrs: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"not an IP range (CIDR): {cidr!r}") from exc
    return tuple(out)


def parse_cidrs(cidrs: Sequence[str]) -> tuple[IPNetwork, ...]:
    """The ranges of an allowlist; `ValueError` naming the first entry that is not a CIDR
    (for validating the setting at startup)."""
    return _networks(tuple(cidrs))


def verify_telegram(
    client_ip: str | None,
    allowed_cidrs: Sequence[str],
    secret_token: str | None,
    headers: Mapping[str, str],
) -> None:
    """The request's source address must be inside one of `allowed_cidrs` (IPv4 or IPv6; an
    IPv4-mapped IPv6 address counts as its IPv4 address). An empty allowlist admits nobody:
    to accept any source, list `0.0.0.0/0` and `::/0` and rely on a secret token. When
    `secret_token` is set, `X-Telegram-Bot-Api-Secret-Token` must equal it.

    `client_ip` must be the real peer: the caller resolves `X-Forwarded-For` only for trusted
    proxies. An allowlist entry that is not a CIDR raises `ValueError` (a configuration
    error, not the sender's)."""
    networks = parse_cidrs(allowed_cidrs)
    if not client_ip:
        raise VerificationFailed("telegram source: the client address is unknown")
    try:
        address = ipaddress.ip_address(client_ip.strip())
    except ValueError as exc:
        raise VerificationFailed(
            "telegram source: the client address is not an IP address"
        ) from exc
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    if not any(a in net for a in candidates for net in networks):
        raise VerificationFailed(f"telegram source: {address} is not in the allowed address ranges")
    if secret_token:
        given = header(headers, "x-telegram-bot-api-secret-token")
        if given is None:
            raise VerificationFailed(
                "telegram source: missing X-Telegram-Bot-Api-Secret-Token header"
            )
        if not _same(given, secret_token):
            raise VerificationFailed(
                "telegram source: X-Telegram-Bot-Api-Secret-Token does not match"
            )


class TeamsVerifiers:
    """The process's Teams verifiers, one per bot (token audience), made on first use and
    kept: each caches its key set, so a verifier made per request would fetch the JWKS on
    every delivery."""

    def __init__(self, jwks_url: str, issuer: str) -> None:
        self._jwks_url = jwks_url
        self._issuer = issuer
        self._by_audience: dict[str, TeamsVerifier] = {}

    def for_audience(self, audience: str) -> TeamsVerifier:
        verifier = self._by_audience.get(audience)
        if verifier is None:
            verifier = TeamsVerifier(self._jwks_url, self._issuer, audience)
            self._by_audience[audience] = verifier
        return verifier
