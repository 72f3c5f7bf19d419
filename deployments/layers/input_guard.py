"""Input every route refuses, checked once in a layer rather than per route: a body over
`max_request_bytes` (413, by its Content-Length or as it streams), NUL characters and lone
surrogates (Postgres text cannot hold the first, UTF-8 cannot encode the second: either was
a 500 deep inside), and JSON nested deeper than any request of ours needs (the parser and
our walkers recurse on it). Each is a 400 naming where it was found.

JSON bodies are scanned cheaply first: a body with no `\\u` escape and fewer brackets than
the depth bound cannot hold any of these, so only other bodies are parsed to be checked.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.asgi_body import read_body, replay
from deployments.layers.context import header
from orchestrator.errors import PayloadTooLarge, ValidationFailed

MAX_JSON_DEPTH = 64


def _refused(where: str, what: str) -> ValidationFailed:
    where = where or "body"  # field names as request validation names them: `steps[0].name`
    return ValidationFailed(
        f"{where}: {what}", extra={"fields": [{"field": where, "message": what}]}
    )


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def check_target(scope: Scope) -> None:
    """The path and the query string."""
    problem = _bad_text(scope.get("path", ""))
    if problem:
        raise _refused("path", problem)
    query = scope.get("query_string", b"")
    if query:
        raw = unquote_to_bytes(query.replace(b"+", b" "))
        if b"\x00" in raw:
            raise _refused("query", "contains a NUL character")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _refused("query", "not valid UTF-8") from None


def is_json(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            return b"json" in value.lower()
    return False


def check_json(body: bytes) -> None:
    """Refuse NUL, lone surrogates (in strings or keys) and nesting past MAX_JSON_DEPTH;
    malformed JSON is left to the route (its own 400/422)."""
    if b"\\u" not in body and body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return
    try:
        value = json.loads(body)
    except RecursionError:
        raise _refused("body", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        return
    _walk(value, "", 0)


def _walk(value: Any, where: str, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise _refused(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        problem = _bad_text(value)
        if problem:
            raise _refused(where, problem)
    elif isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key[:40]}" if where else key[:40]
            problem = _bad_text(key)
            if problem:
                raise _refused(inner, f"key {problem}")
            _walk(item, inner, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{where}[{i}]", depth + 1)


class InputGuard:
    """The checks above, before any route runs; a JSON body is read here whole (to be
    checked) and handed on as it came."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self._limit = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(
                f"request body of {declared} bytes; at most {limit} (max_request_bytes)",
                extra={"size": int(declared), "limit": limit},
            )
        check_target(scope)
        receive = _capped(receive, limit)
        if scope["method"] in ("POST", "PUT", "PATCH") and is_json(scope):
            body = await read_body(receive)
            check_json(body)
            receive = replay(body, receive)
        await self.app(scope, receive, send)


def _capped(receive: Receive, limit: int) -> Receive:
    """`receive` that stops a body (chunked, or longer than it declared) past `limit`."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(
                    f"request body over {limit} bytes (max_request_bytes)",
                    extra={"limit": limit},
                )
        return message

    return capped
