"""HTTP must come through this service's proxy (issue 19): a request without the ingress key
(`RequestContext` checks it) is refused with 421, answered and recorded like any refusal."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.errors import MisdirectedRequest


class IngressGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["state"]["through_our_proxy"]:
            raise MisdirectedRequest("this request did not come through this service's proxy")
        await self.app(scope, receive, send)
