"""What the Ollama, Gemini and Bedrock fakes share: a raw ASGI app under uvicorn in a thread
on a free loopback port, a queue of scripted replies, and a record of every request."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import uvicorn

from tests.fakes._sockets import bound_socket

__all__ = ["LoopbackServer", "RecordedRequest", "Send", "hashed_embedding", "pieces"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    raw_path: str  # as sent on the wire, percent-encoding kept
    query: str
    headers: dict[str, str]  # lower-case names
    raw: bytes

    @property
    def path(self) -> str:
        return unquote(self.raw_path)

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None


def pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def hashed_embedding(text: str, dim: int) -> list[float]:
    """The fakes' embedding model: words hashed into `dim` buckets, L2-normalised, so texts
    sharing words are close (the same function as the OpenAI fake's)."""
    vector = [0.0] * dim
    for word in text.lower().split():
        vector[uuid.uuid5(uuid.NAMESPACE_OID, word.strip(".,!?")).int % dim] += 1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


class LoopbackServer:
    """Subclasses implement `handle(request, send)`; `script()` queues replies that
    `next_reply()` hands out in order."""

    label = "fake"

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        # Problems found in request bodies by the fake's wire checks (answered with a 400).
        self.violations: list[str] = []
        self._script: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._socket = bound_socket()
        # Closed when the server stops, or when the fake is dropped without starting.
        weakref.finalize(self, self._socket.close)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,  # uvicorn's records go to pytest's capture, not the terminal
            log_level="warning",
            access_log=False,
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    # --- scripting ------------------------------------------------------------------------
    def script(self, *replies: Any) -> None:
        with self._lock:
            self._script.extend(replies)

    def next_reply(self) -> Any | None:
        with self._lock:
            return self._script.popleft() if self._script else None

    @property
    def pending(self) -> int:
        return len(self._script)

    # --- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Any:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                raise RuntimeError(f"the {self.label} server failed to start")
            await asyncio.sleep(0.01)
        raise RuntimeError(f"the {self.label} server did not start in time")

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)
        self._socket.close()

    # --- the ASGI app ---------------------------------------------------------------------
    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = RecordedRequest(
            method=scope["method"],
            raw_path=scope["raw_path"].decode("latin-1"),
            query=scope["query_string"].decode("latin-1"),
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
            raw=raw,
        )
        self.requests.append(request)
        await self.handle(request, send)

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        raise NotImplementedError

    # --- answering ------------------------------------------------------------------------
    @staticmethod
    async def send_body(
        send: Send, status: int, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> None:
        """A complete answer with a Content-Length."""
        out = [(k.lower().encode(), v.encode()) for k, v in headers]
        out.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def send_json(
        send: Send, status: int, obj: Any, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        await LoopbackServer.send_body(
            send,
            status,
            json.dumps(obj).encode(),
            [("content-type", "application/json; charset=utf-8"), *headers],
        )

    @staticmethod
    async def send_stream(
        send: Send,
        headers: Sequence[tuple[str, str]],
        frames: Iterable[bytes],
        *,
        fail_after: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """A chunked 200 answer, one frame per chunk. With `fail_after`, only that many
        frames are sent and the body is left unfinished: uvicorn then drops the connection,
        as a dying upstream does."""
        out = [(k.lower().encode(), v.encode()) for k, v in headers]
        await send({"type": "http.response.start", "status": 200, "headers": out})
        for n, frame in enumerate(frames):
            if fail_after is not None and n >= fail_after:
                return
            if delay_s and n:
                await asyncio.sleep(delay_s)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
