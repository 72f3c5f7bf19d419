"""`ServiceSettings`: the first keys of `Settings` (_settings.py), where the service runs
(addresses, HAProxy, replicas, pools, logs) and how callers authenticate (admin token, JWT,
auth caches and rate limits), with the settings' pydantic configuration.

A base class only to keep _settings.py within the house's module size: `Settings` is still
the one class every key is read from (`settings.port`, `ORCH_PORT`). Pydantic lists a base's
fields before the subclass's, so these are the keys that come first in docs/configuration.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["MIN_ADMIN_TOKEN_LEN", "ServiceSettings"]

MIN_ADMIN_TOKEN_LEN = 32


class ServiceSettings(BaseSettings):
    """Where the service runs and how callers authenticate (see the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix="ORCH_",
        env_nested_delimiter="__",
        env_ignore_empty=True,  # ORCH_X= (empty) leaves X unset, as an absent variable does
        extra="forbid",
        validate_default=True,
    )

    # --- where it runs -------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address the HTTP API binds to")
    port: int = Field(8000, ge=1, le=65535, description="Port of the HTTP API")
    data_dir: Path = Field(
        Path("./.orchestrator"), description="Embedded Postgres/Redis data, logs"
    )
    database_url: str | None = Field(
        None, repr=False, description="External Postgres; unset = embedded"
    )
    redis_url: str | None = Field(None, repr=False, description="External Redis; unset = embedded")
    ray_address: str | None = Field(None, description="Join this Ray cluster; unset = local")
    dashboard: bool = Field(False, description="Start the Ray dashboard with a local cluster")
    haproxy: bool = Field(True, description="Serve through HAProxy in throughput-optimized mode")
    ingress_key: SecretStr | None = Field(
        None,
        repr=False,
        description="Set by `orchestrator serve` with HAProxy: the key its HAProxy adds to "
        "every request; replicas answer 421 to requests without it (not another service's)",
    )
    proxy_header_timeout_s: int = Field(
        10, ge=1, le=300, description="HAProxy: longest time a client may take to send headers"
    )
    proxy_client_timeout_s: int = Field(
        120, ge=10, le=86_400, description="HAProxy: longest silence of a client connection"
    )
    proxy_max_connections: int = Field(
        8192,
        ge=64,
        description="HAProxy: client connections in all (maxconn; capped by the open-file limit)",
    )
    proxy_max_conns_per_source: int = Field(
        256, ge=1, description="HAProxy: open connections allowed per client address"
    )
    proxy_request_log: bool = Field(
        False,
        description="HAProxy: a log line per request (feeds Serve's HTTP request metrics in "
        "the Ray dashboard; the replicas' access log and svc_http_* count every request anyway)",
    )
    proxy_connection_affinity: bool = Field(
        True,
        description="HAProxy: while no other request is in flight, a client connection's "
        "request goes to the replica its last one went to (a sequential client stays on a "
        "warm replica: ~1 ms a call on 2 cores); with any in flight, leastconn balances each "
        "request (docs/design-notes.md)",
    )
    api_replicas: int = Field(
        2, ge=1, description="Replicas of the HTTP ingress deployment (2: throughput, failover)"
    )
    api_replica_cpus: float = Field(0.25, gt=0, description="Ray CPUs reserved per replica")
    api_max_ongoing_requests: int = Field(
        4096,
        ge=1,
        description="Concurrent requests per ingress replica (open SSE streams count)",
    )
    access_log: bool = Field(
        False,
        description="One access line per request (request id, user, method, route template, "
        "status, duration); costly at high rates, metrics count requests anyway",
    )
    db_pool_min: int = Field(1, ge=0, description="Minimum Postgres connections per process")
    db_pool_max: int = Field(10, ge=1, description="Maximum Postgres connections per process")
    log_level: str = Field("INFO", description="Python log level")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: every log line of the driver, replicas, actors and Serve is one "
        "JSON object (time, level, logger, message, request fields) to ship as is",
    )

    # --- auth ----------------------------------------------------------------------------
    admin_token: SecretStr | None = Field(
        None, description="Registered as an admin token (at least 32 characters)"
    )
    exempt_paths: list[str] = Field(
        default_factory=lambda: [
            "/api/v1/health",
            "/api/v1/ready",
            "/api/v1/metrics",
            "/api/v1/slo",
        ],
        description="Paths served without a bearer token",
    )
    auth_cache_ttl_s: float = Field(
        60.0,
        ge=0,
        description="Longest a replica keeps a verified token in its cache (a safety net: a "
        "revoked or deleted token is dropped everywhere by NOTIFY within 1 s); 0 = no cache",
    )
    auth_cache_max_entries: int = Field(
        10_000, ge=1, description="Verified tokens a replica caches at most (oldest go first)"
    )
    jwt_secret: SecretStr | None = Field(None, description="HS256 secret for JWT bearers")
    jwt_jwks_url: str | None = Field(None, description="JWKS URL for RS256/ES256 JWT bearers")
    jwt_issuer: str | None = Field(None, description="Required JWT issuer (iss)")
    jwt_audience: str | None = Field(None, description="Required JWT audience (aud)")
    jwt_user_claim: str = Field("sub", description="JWT claim holding the user_uuid")
    jwt_admin_claim: str | None = Field(
        None,
        min_length=1,
        description="JWT claim that, when exactly true, makes the bearer an admin (of every "
        "tenant); unset = no JWT is ever an admin",
    )
    auth_failures_per_address: int = Field(
        20,
        ge=0,
        description="Failed authentications a client address may make at once, then one per "
        "auth_failure_window_s / this (429 beyond); 0 = off",
    )
    auth_failure_window_s: float = Field(
        10.0,
        gt=0,
        description="Seconds in which a client address regains all of auth_failures_per_address",
    )
    rate_limit_per_minute: int = Field(
        600, ge=0, description="Requests per token per minute; 0 = off"
    )
    rate_limit_sync_s: float = Field(
        0.2,
        gt=0,
        le=5,
        description="Seconds between a replica's rate-limit syncs with Redis (counting the "
        "replicas that share a budget, giving back leases of credentials gone quiet)",
    )
    max_request_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Largest request body; 413 above (a workspace file in base64 fits)",
    )
    idempotency_ttl_s: int = Field(
        86_400,
        ge=1,
        le=30 * 86_400,
        description="How long an Idempotency-Key of POST /workflows, /memory/<agent_id>/store "
        "and /marketplace/publish replays its first answer; then the key is free again",
    )

    @field_validator("admin_token", mode="after")
    @classmethod
    def _strong_admin_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_ADMIN_TOKEN_LEN:
            raise ValueError(
                f"admin_token must be at least {MIN_ADMIN_TOKEN_LEN} characters of random text "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        return v
