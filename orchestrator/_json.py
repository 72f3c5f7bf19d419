"""JSON on the hot paths (the gateway's requests, responses and stream chunks, the event
store's bodies): orjson (several times faster than `json` for small objects), with `json`
as the fallback for what orjson refuses (integers past 64 bits, non-string keys), so no
value that encoded before fails now. Output is compact UTF-8, as OpenAI and Anthropic write
it. Decoding, orjson reads an integer past 64 bits as a float (rounded, silently): text with
a run of 19 or more digits is read by `json`, which keeps it an exact int."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["dumps", "loads"]


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, non-ASCII kept as UTF-8."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# 19 digits in a row may be an integer orjson cannot hold (2^63 has 19); a false match (a
# long digit string, a long fraction) only costs `json`'s speed, never a different value.
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_B = re.compile(rb"[0-9]{19}")


def loads(data: bytes | str) -> Any:
    """Decode JSON; raises ValueError (orjson.JSONDecodeError is one) when it is not."""
    long = _LONG_DIGITS.search(data) if isinstance(data, str) else _LONG_DIGITS_B.search(data)
    if long is not None:
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # `json` also reads NaN/Infinity, which some servers write: same answers as before.
        return json.loads(data)
