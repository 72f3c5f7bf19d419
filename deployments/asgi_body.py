"""A request body read whole from ASGI `receive`, and handed on as if unread: for a layer or a
route that must see the body before the code after it reads it (deployments/layers/input_guard.py,
deployments/json_route.py)."""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: what follows sees the body so far
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """The body read once already, then the connection's own messages (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
