"""The request's context, first of the app's layers: its id, and whether it came through
this service's own proxy (the ingress key).

Under Serve, X-Request-ID was made by a hop of ours (deployments/edge.py, our HAProxy) and
is echoed by Serve: kept when well-formed, so the header, the error body and the logs agree.
Served alone, this is the first hop: a client's id is never ours, only kept apart
(`client_request_id`) when well-formed. A request that skipped our HAProxy (no ingress key)
came straight from a client: its X-Request-ID is the client's, never ours, though the edge
in front had to trust it; such a request is refused further in (`IngressGuard`).

Sets in the request's state (`scope["state"]`, Starlette's `request.state`): `request_id`,
`client_request_id` and `through_our_proxy`.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.edge import request_ids

INGRESS_HEADER = b"x-orch-ingress"


def header(scope: Scope, name: bytes) -> str | None:
    """The first header `name` (lower case) of the request, or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContext:
    def __init__(self, app: ASGIApp, echo_request_id: bool, ingress_key: str | None) -> None:
        self.app = app
        # Serve's proxy already answers with X-Request-ID (the id it put in the request headers).
        self._echo = echo_request_id
        self._ingress_key = ingress_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        through = self._ingress_key is None or hmac.compare_digest(
            header(scope, INGRESS_HEADER) or "", self._ingress_key
        )
        request_id, client_request_id = request_ids(
            scope.get("headers", ()), trusted=not self._echo and through
        )
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["client_request_id"] = client_request_id
        state["through_our_proxy"] = through
        # Serve echoes the id it was handed (the client's, when the request skipped our
        # proxy): ours goes first and the edge drops Serve's (deployments/edge.py).
        if through and not self._echo:
            await self.app(scope, receive, send)
            return
        id_header = (b"x-request-id", request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [id_header, *message.get("headers", [])]
            await send(message)

        await self.app(scope, receive, send_with_id)
