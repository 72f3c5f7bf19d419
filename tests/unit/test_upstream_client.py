"""The upstream client's own pieces: lines out of a body that arrives in any pieces, and
the timeouts handed to aiohttp."""

from __future__ import annotations

import itertools
import re

import httpx
import pytest

from orchestrator.providers._client import LineSplitter, client_timeout

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
