"""Input every route refuses, checked once at the edge rather than per route: NUL characters
and lone surrogates (Postgres text cannot hold the first, UTF-8 cannot encode the second:
either was a 500 deep inside), and JSON nested deeper than any request of ours needs (the
parser and our walkers recurse on it). Each is a 400 naming where it was found.

JSON bodies are scanned cheaply first: a body with no `\\u` escape and fewer brackets than
the depth bound cannot hold any of these, so only other bodies are parsed to be checked.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import Scope

from orchestrator.errors import ValidationFailed

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
