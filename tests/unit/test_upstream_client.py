"""The upstream client's own pieces: lines out of a body that arrives in any pieces (UTF-8
whatever the Content-Type says, a multi-byte character cut anywhere), and the timeouts handed
to aiohttp."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from orchestrator.providers._client import LineSplitter, client_timeout, utf8_lines
from orchestrator.providers._http import iter_ndjson, iter_sse

TEXTS = [
    "data: a\n\ndata: b\n\n",
    "data: a\r\n\r\ndata: b\r\n\r\n",
    "data: a\r\rdata: b\r\r",
    "event: x\r\ndata: 1\rdata: 2\n\r\n: ping\n\n",
    "no end",
    "ends with cr\r",
    "x\n\r",
    "\r\n\r\n",
    "",
]


def _reference(text: str) -> list[str]:
    """The lines of the whole text at once, as the SSE spec and httpx split them."""
    lines = re.split(r"\r\n|\r|\n", text)
    if lines[-1] == "":
        lines.pop()
    return lines


def _pieces(text: str, cuts: tuple[int, ...]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("text", TEXTS)
def test_any_split_of_the_body_gives_the_same_lines(text: str) -> None:
    expected = _reference(text)
    # Every way of cutting the text in up to three pieces (a CR and its LF apart included).
    for count in range(3):
        for cuts in itertools.combinations_with_replacement(range(len(text) + 1), count):
            splitter = LineSplitter()
            got = [line for piece in _pieces(text, cuts) for line in splitter.feed(piece)]
            got += splitter.close()
            assert got == expected, (text, cuts)


def test_timeouts_are_per_operation_as_httpx_has_them() -> None:
    default = httpx.Timeout(30.0, connect=5.0)
    given = client_timeout(None, default)
    assert (given.total, given.sock_connect, given.sock_read, given.connect) == (
        None,
        5.0,
        30.0,
        30.0,
    )
    short = client_timeout(httpx.Timeout(2.0), default)
    assert (short.sock_connect, short.sock_read) == (2.0, 2.0)
    assert client_timeout(7.5, default).sock_read == 7.5


# --- UTF-8 across chunk boundaries ------------------------------------------------------------
# One character of each UTF-8 length: é (2 bytes), € (3), 😀 (4; a surrogate pair in UTF-16).
MULTIBYTE = "é€😀"
STREAMS = [
    f'data: {{"content":"{MULTIBYTE}"}}\n\ndata: [DONE]\n\n',
    f'data: {{"content":"{MULTIBYTE}"}}\r\n\r\ndata: [DONE]\r\n\r\n',
    f'{{"message":{{"content":"a{MULTIBYTE}z"}}}}\r\n{{"done":true}}\r\n',
    f"event: x\r\ndata: {MULTIBYTE}\r{MULTIBYTE}\n\n",
]


async def _chunks(body: bytes, cuts: tuple[int, ...]) -> AsyncIterator[bytes]:
    bounds = [0, *cuts, len(body)]
    for a, b in itertools.pairwise(bounds):
        yield body[a:b]


async def _lines(body: bytes, cuts: tuple[int, ...]) -> list[str]:
    return [line async for line in utf8_lines(_chunks(body, cuts))]


@pytest.mark.parametrize("text", STREAMS)
async def test_every_cut_of_the_bytes_gives_the_same_text_lines(text: str) -> None:
    """A chunk may end inside a multi-byte character (any byte of it) or between a CR and
    its LF: the lines are those of the whole text, in every case."""
    body = text.encode()
    expected = _reference(text)
    for count in range(3):
        for cuts in itertools.combinations_with_replacement(range(len(body) + 1), count):
            assert await _lines(body, cuts) == expected, cuts


async def test_each_byte_alone_still_decodes() -> None:
    text = STREAMS[1]
    body = text.encode()
    assert await _lines(body, tuple(range(1, len(body)))) == _reference(text)


async def test_a_leading_byte_order_mark_is_dropped_and_bad_bytes_replaced() -> None:
    body = b"\xef\xbb\xbfdata: ok\n\ndata: \xff\xc3\n\n"
    assert await _lines(body, (1, 2)) == ["data: ok", "", "data: \ufffd\ufffd", ""]


class _Body(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


def _response(content_type: str | None, pieces: list[bytes]) -> httpx.Response:
    headers = {} if content_type is None else {"content-type": content_type}
    return httpx.Response(200, headers=headers, stream=_Body(pieces))


# As llama.cpp (none), OpenAI (utf-8), a server that names another one (wrongly: the bytes
# are UTF-8, as an event stream always is), and one that names an unknown charset.
CONTENT_TYPES = [
    "text/event-stream",
    "text/event-stream; charset=utf-8",
    "text/event-stream; charset=iso-8859-1",
    "text/event-stream; charset=x-unknown",
    None,
]


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
async def test_sse_is_utf8_whatever_the_content_type_says(content_type: str | None) -> None:
    body = f'data: {{"t":"{MULTIBYTE}"}}\r\n\r\nevent: end\r\ndata: {MULTIBYTE}\r\n\r\n'.encode()
    split = body.index("€".encode()) + 1  # inside the 3-byte character
    events = [e async for e in iter_sse(_response(content_type, [body[:split], body[split:]]))]
    assert events == [("message", f'{{"t":"{MULTIBYTE}"}}'), ("end", MULTIBYTE)]


@pytest.mark.parametrize("content_type", ["application/x-ndjson", "text/plain; charset=latin-1"])
async def test_ndjson_is_utf8_whatever_the_content_type_says(content_type: str) -> None:
    body = f'{{"content":"{MULTIBYTE}"}}\n{{"done":true}}\n'.encode()
    split = body.index("😀".encode()) + 3  # before the last byte of the 4-byte character
    values = [v async for v in iter_ndjson(_response(content_type, [body[:split], body[split:]]))]
    assert values == [{"content": MULTIBYTE}, {"done": True}]
