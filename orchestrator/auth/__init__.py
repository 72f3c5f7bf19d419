"""Who is calling: bearer tokens (opaque or JWT), principals, per-token rate limits."""

from orchestrator.auth._authenticator import Authenticator
from orchestrator.auth._jwt import JwtVerifier, jwt_user_uuid
from orchestrator.auth._principal import Principal
from orchestrator.auth._ratelimit import RateLimiter
from orchestrator.auth._throttle import FailedAuthThrottle
from orchestrator.auth._tokens import (
    ADMIN_USER,
    IssuedToken,
    TokenInfo,
    TokenStore,
    generate_token,
    hash_token,
    token_prefix,
)

__all__ = [
    "ADMIN_USER",
    "Authenticator",
    "FailedAuthThrottle",
    "IssuedToken",
    "JwtVerifier",
    "Principal",
    "RateLimiter",
    "TokenInfo",
    "TokenStore",
    "generate_token",
    "hash_token",
    "jwt_user_uuid",
    "token_prefix",
]
