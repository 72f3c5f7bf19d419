"""Authentication and the per-caller rate limit, for every path but the public ones.

A layer, not a per-route dependency, so that no route can be served without it (one added
later included) and a request is refused before its body is read: every path outside
`exempt_paths`, a channel's webhook and the console's static files needs a bearer token (an
unknown path too: 401, not 404). The admitted caller is the request's `principal`
(`scope["state"]`), which the routes' `CurrentUser` dependency and the JsonRoutes' endpoints
read through the same function (deployments/deps.py `principal_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from deployments.client_address import scope_client_address
from deployments.layers.context import header
from orchestrator.auth import Principal
from orchestrator.errors import Unauthorized

WEBHOOK_PREFIX = "/api/v1/channels/webhook/"


def is_public(path: str, exempt: Collection[str]) -> bool:
    """Served without a bearer token: the exempt paths, a channel's webhook (it carries its
    own credential: the token in the path, then the platform's signature, checked by its
    handler) and the web console's static files (its data calls are the API's, with the
    token)."""
    return (
        path in exempt
        or path.startswith(WEBHOOK_PREFIX)
        or path == "/ui"
        or path.startswith("/ui/")
    )


def credentials(scope: Scope) -> str | None:
    """The bearer credentials: `Authorization`, else `x-api-key` (what the official
    Anthropic SDK sends its key in), taken as a bearer token."""
    authorization = header(scope, b"authorization")
    if authorization:
        return authorization
    api_key = header(scope, b"x-api-key")
    return f"Bearer {api_key}" if api_key else None


async def authenticate(ctx: Any, scope: Scope, trusted_proxies: Sequence[str]) -> Principal:
    """The caller the request's credentials name; Unauthorized when none or not valid. Only
    a presented credential costs a lookup: those failures are throttled per client address
    (asked before a lookup, not for a token just verified)."""
    given = credentials(scope)
    address = scope_client_address(scope, trusted_proxies) if given else None
    try:
        return await ctx.authenticator.authenticate(  # type: ignore[no-any-return]
            given, lambda: ctx.auth_throttle.check(address)
        )
    except Unauthorized:
        await ctx.auth_throttle.failed(address)
        raise


async def rate_limit(ctx: Any, principal: Principal) -> None:
    """A 429 past the caller's requests a minute (`rate_limit_per_minute`)."""
    if ctx.rate_limiter.enabled:
        await ctx.rate_limiter.hit(principal.subject or principal.user_uuid)


class Authentication:
    def __init__(
        self,
        app: ASGIApp,
        services_getter: Callable[[], Any],
        exempt_paths: Sequence[str],
        trusted_proxies: Sequence[str],
    ) -> None:
        self.app = app
        self._ctx = services_getter
        self._exempt = frozenset(exempt_paths)
        self._trusted_proxies = trusted_proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_public(scope["path"], self._exempt):
            ctx = self._ctx()
            principal = await authenticate(ctx, scope, self._trusted_proxies)
            scope["state"]["principal"] = principal
            await rate_limit(ctx, principal)
        await self.app(scope, receive, send)
