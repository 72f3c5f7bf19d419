"""What the Ollama, Gemini and Bedrock fakes share: a raw ASGI app under uvicorn in a thread
on a free loopback port, a queue of scripted replies, and a record of every request.

Each subclass answers as its peer does on the wire: `json_type` (the Content-Type of its JSON
answers, charset or not, as the peer sends it), `json_text` (how the peer serialises JSON:
raw UTF-8 unless the peer escapes non-ASCII), and the uvicorn options `http` / `server_header`
/ `date_header`: under `http="h11"` header names keep the case the fake writes (uvicorn's
httptools protocol lower-cases them; h11 title-cases only the framing headers it adds), for a
peer whose names are not lower-case (Go's canonical `Content-Type`, cpp-httplib's)."""

from __future__ import annotations

import asyncio
import collections
import email.utils
import json
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import unquote

import uvicorn

from tests.fakes._sockets import bound_socket

__all__ = [
    "LoopbackServer",
    "RecordedRequest",
    "Send",
    "hashed_embedding",
    "http_date",
    "pieces",
    "reframe",
]

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


def reframe(
    frames: Iterable[bytes], *, line_end: str = "\n", byte_chunk: int | None = None
) -> list[bytes]:
    """The body pieces as a fake sends them. `line_end` replaces each LF of the frames (safe:
    JSON text holds no raw newline); with `byte_chunk` the body goes out in slices of that
    many bytes, which cut frames, line ends and multi-byte characters anywhere."""
    out = (
        [f.replace(b"\n", line_end.encode()) for f in frames] if line_end != "\n" else list(frames)
    )
    if not byte_chunk:
        return out
    body = b"".join(out)
    return [body[i : i + byte_chunk] for i in range(0, len(body), byte_chunk)]


def http_date() -> str:
    """An HTTP Date header value (IMF-fixdate), for a fake that writes its own."""
    return email.utils.formatdate(usegmt=True)


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
    json_type: ClassVar[str] = "application/json; charset=utf-8"
    http: ClassVar[Literal["auto", "h11", "httptools"]] = "auto"
    server_header: ClassVar[bool] = True  # uvicorn's own `server: uvicorn`
    date_header: ClassVar[bool] = True

    @classmethod
    def json_text(cls, obj: Any) -> str:
        """`obj` serialised as the peer does: most send raw UTF-8 (a multi-byte character
        then reaches the client as bytes that a chunk boundary can cut)."""
        return json.dumps(obj, ensure_ascii=False)

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
            http=self.http,
            server_header=self.server_header,
            date_header=self.date_header,
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

    def __enter__(self) -> Any:
        """Started from synchronous code (a module-scoped or e2e fixture): served by its own
        thread all the same."""
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.label} server failed to start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
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
    # Header names are passed as written (see the module docstring on their case).
    @classmethod
    def peer_headers(cls) -> list[tuple[str, str]]:
        """Headers the peer's server adds to every answer (its Server, its Date)."""
        return []

    @classmethod
    async def send_body(
        cls, send: Send, status: int, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> None:
        """A complete answer with a Content-Length."""
        out = [(k.encode(), v.encode()) for k, v in [*cls.peer_headers(), *headers]]
        out.append((b"Content-Length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})

    @classmethod
    async def send_json(
        cls, send: Send, status: int, obj: Any, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        await cls.send_body(
            send,
            status,
            cls.json_text(obj).encode(),
            [("Content-Type", cls.json_type), *headers],
        )

    @classmethod
    async def send_stream(
        cls,
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
        out = [(k.encode(), v.encode()) for k, v in [*cls.peer_headers(), *headers]]
        await send({"type": "http.response.start", "status": 200, "headers": out})
        sent = 0
        for frame in frames:
            if fail_after is not None and sent >= fail_after:
                return
            if delay_s and sent:
                await asyncio.sleep(delay_s)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            sent += 1
        if fail_after is not None and sent >= fail_after:
            return  # all `fail_after` frames sent: still no end of the body
        await send({"type": "http.response.body", "body": b""})
