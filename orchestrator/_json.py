"""JSON on the hot paths (the gateway's requests, responses and stream chunks, the event
store's bodies): orjson (several times faster than `json` for small objects), with `json`
as the fallback for what orjson refuses (integers past 64 bits, non-string keys), so no
value that encoded before fails now. Output is compact UTF-8, as OpenAI and Anthropic write
it."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, non-ASCII kept as UTF-8."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Decode JSON; raises ValueError (orjson.JSONDecodeError is one) when it is not."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # `json` also reads NaN/Infinity, which some servers write: same answers as before.
        return json.loads(data)
