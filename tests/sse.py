"""Reading Server-Sent Events in tests, as an EventSource client parses them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx


async def sse_frames(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """Yield each frame as {field: value} (`id`, `event`, `data`, `retry`); a comment line
    yields {"comment": text} at once."""
    frame: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            name, _, value = line.partition(":")
            frame[name] = value.lstrip()
