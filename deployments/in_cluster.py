"""Requests that arrive over the Api deployment handle (orchestrator/sdk/_serve_transport.py),
run through the replica's own ASGI app. No Ray here: `deployments.app` calls this. The
envelope is a wire model (orchestrator/wire/handle.py): this module imports nothing of the
SDK, and the SDK nothing of it.

Why the whole app and not the domain services directly: authentication, the failed-auth
throttle, the rate limit, body limits, validation and every route's ownership checks live in
the request layers (deployments/layers) and the routers; going through them is what makes a
handle call act as its token's principal and nothing more.

What the caller cannot choose: the client address is `ray-handle` (one throttling bucket for
handle callers; it is not an IP, so no `trusted_proxies` entry can make a forwarded header
count), the request id is made here, and the ingress key (issue 19: HTTP must come through
our proxy) is the replica's own, since this is not HTTP. Only the bearer credentials
(`Authorization` or `x-api-key`) say who is calling.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Message, Scope

from orchestrator.wire.handle import HandleRequest, HandleResponse

log = logging.getLogger(__name__)

CLIENT = "ray-handle"
# Headers a handle caller may not set: they carry what only the service decides.
# Requests still running after their caller has its answer (held so they are not collected).
_finishing: set[asyncio.Task[None]] = set()
_REPLACED = frozenset(
    {b"x-orch-ingress", b"x-request-id", b"x-forwarded-for", b"forwarded", b"x-real-ip"}
)


def _scope(request: HandleRequest, request_id: str, ingress_key: str | None) -> Scope:
    headers = [(k.lower(), v) for k, v in request.headers if k.lower() not in _REPLACED]
    headers.append((b"x-request-id", request_id.encode("ascii")))
    if ingress_key is not None:
        headers.append((b"x-orch-ingress", ingress_key.encode("latin-1")))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method.upper(),
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode("utf-8"),
        "query_string": request.query,
        "root_path": "",
        "headers": headers,
        "client": (CLIENT, 0),
        "server": (CLIENT, 0),
        "state": {},
    }


async def serve_request(
    app: ASGIApp, request: HandleRequest, ingress_key: str | None
) -> AsyncIterator[HandleResponse | bytes]:
    """The answer to `request`: a `HandleResponse`, then body chunks while there are more.
    Closing the generator early (the caller left) is a disconnect for the route."""
    request_id = uuid.uuid4().hex
    messages: asyncio.Queue[Message] = asyncio.Queue()
    left = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await messages.put(message)

    async def run() -> None:
        await app(_scope(request, request_id, ingress_key), receive, send)

    task = asyncio.create_task(run())
    try:
        head = await _next(messages, task)
        if head is None or head["type"] != "http.response.start":
            raise RuntimeError(f"the app answered {request.method} {request.path} with nothing")
        headers = list(head.get("headers", []))
        if not any(k.lower() == b"x-request-id" for k, _ in headers):
            # Under Serve the app leaves this to the proxy, which a handle call has not.
            headers.append((b"x-request-id", request_id.encode("ascii")))
        # The head goes with the body that came with it, without waiting for more: a stream
        # may send nothing for a long while, and its caller is waiting for the status.
        body, more = _arrived(messages)
        yield HandleResponse(head["status"], tuple(headers), body, more)
        while more:
            body, more = await _body(messages, task)
            if body or not more:
                yield body
    finally:
        # As uvicorn does when a connection ends: the app is told (a stream stops) and left
        # to finish on its own (its background work after the answer included), not killed.
        left.set()
        if not task.done():
            _finishing.add(task)
            task.add_done_callback(_finished)


def _finished(task: asyncio.Task[None]) -> None:
    _finishing.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("a handle request failed after its answer: %r", task.exception())


async def _next(messages: asyncio.Queue[Message], task: asyncio.Task[None]) -> Message | None:
    """The app's next message, or None when it ended without one (its error is raised)."""
    if not messages.empty():
        return messages.get_nowait()
    getter = asyncio.ensure_future(messages.get())
    try:
        await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # The caller left (a cancelled handle call): the getter would wait forever, a
        # pending task per abandoned stream, destroyed pending by the garbage collector.
        getter.cancel()
        raise
    if getter.done():
        return getter.result()
    getter.cancel()
    task.result()  # raises what the app raised
    return None


async def _body(messages: asyncio.Queue[Message], task: asyncio.Task[None]) -> tuple[bytes, bool]:
    """The body chunks that have arrived (waiting for the first), as one, and whether more
    follow. Coalescing keeps a burst of stream frames one item on the handle."""
    message = await _next(messages, task)
    if message is None:
        return b"", False  # the app ended without finishing its body
    return _arrived(messages, message)


def _arrived(messages: asyncio.Queue[Message], first: Message | None = None) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    message = first
    while message is not None or not messages.empty():
        message = message if message is not None else messages.get_nowait()
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks), False
        message = None
    return b"".join(chunks), True
