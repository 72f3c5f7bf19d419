"""The `gateway` benchmark's upstream: a minimal OpenAI chat completions server on loopback.

A raw ASGI app (no framework, nothing the answer does not need), run by the bench in its own
process under uvicorn with uvloop and httptools, so that the bench's client and the gateway
never share its event loop:

    python -m uvicorn --app-dir scripts benchmarks._upstream:app --loop uvloop --http httptools

It answers every `POST /v1/chat/completions` with the same short reply, in OpenAI's wire
format: a `chat.completion` object, or with `"stream": true` SSE frames
`data: <chat.completion.chunk>\\n\\n` (a role chunk, the content in a few chunks, a finish
chunk, with `stream_options.include_usage` a usage chunk with `choices: []`), then
`data: [DONE]\\n\\n`, each frame its own write. `GET /v1/models` lists the model (the
gateway's health probe); `GET /health` answers `{"status": "ok"}` without a key. With
BENCH_UPSTREAM_KEY set, any other request without that bearer gets OpenAI's 401.

Deliberately standalone (standard library only; uvicorn runs it): the bench measures what
the gateway adds on top of this server, so this server must stay as cheap as it can be.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["CONTENT_PIECES", "MODEL", "REPLY_TEXT", "USAGE", "app"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MODEL = "bench-model"
CONTENT_PIECES = ("Hello", "! This is", " the bench", " upstream.")
REPLY_TEXT = "".join(CONTENT_PIECES)
USAGE = {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}
SSE_DONE = b"data: [DONE]\n\n"

_API_KEY = os.environ.get("BENCH_UPSTREAM_KEY")
_ids = itertools.count(1)
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def completion(model: str, completion_id: str) -> dict[str, Any]:
    """The non-streaming `chat.completion` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": REPLY_TEXT,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
        "service_tier": "default",
        "system_fingerprint": "fp_bench",
    }


def chunks(model: str, completion_id: str, include_usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of the streamed reply, in order."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_bench",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None  # OpenAI's framing: null on every chunk but the last
        return c

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    out += [chunk({"content": piece}) for piece in CONTENT_PIECES]
    out.append(chunk({}, "stop"))
    if include_usage:
        last = chunk({})
        last["choices"], last["usage"] = [], USAGE
        out.append(last)
    return out


def _error(message: str, kind: str, code: str | None = None) -> bytes:
    return _dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    method, path = scope["method"], scope["path"]
    body = await _read_body(receive)
    if path == "/health":  # unauthenticated, for the bench to wait on (as llama-server's)
        await _send(send, 200, b'{"status":"ok"}', _JSON_HEADERS)
        return
    if _API_KEY is not None:
        auth = dict(scope["headers"]).get(b"authorization", b"")
        if auth != f"Bearer {_API_KEY}".encode():
            message = "Incorrect API key provided."
            error = _error(message, "invalid_request_error", "invalid_api_key")
            await _send(send, 401, error, _JSON_HEADERS)
            return
    if method == "GET" and path == "/v1/models":
        models = {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}],
        }
        await _send(send, 200, _dumps(models), _JSON_HEADERS)
        return
    if method != "POST" or path != "/v1/chat/completions":
        error = _error(f"Unknown request URL: {method} {path}.", "invalid_request_error")
        await _send(send, 404, error, _JSON_HEADERS)
        return
    try:
        request = json.loads(body)
        model = str(request.get("model") or MODEL)
    except (ValueError, AttributeError):
        message = "We could not parse the JSON body of your request."
        error = _error(message, "invalid_request_error")
        await _send(send, 400, error, _JSON_HEADERS)
        return
    completion_id = f"chatcmpl-bench{next(_ids)}"
    if not request.get("stream"):
        await _send(send, 200, _dumps(completion(model, completion_id)), _JSON_HEADERS)
        return
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    for c in chunks(model, completion_id, include_usage):
        frame = b"data: " + _dumps(c) + b"\n\n"
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": SSE_DONE, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
