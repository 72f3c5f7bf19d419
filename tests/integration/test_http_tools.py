"""Calling a user's HTTP tool (orchestrator/tools/_http.py) against a real HTTP server on
loopback, through the egress-guarded client: what reaches the server (URL, query, JSON body,
headers) and what the model gets back for each kind of answer, a refused destination and a
server too slow."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.tools._http import ACCEPT, USER_AGENT, call_http_tool, http_tools_client
from orchestrator.tools._model import HttpTool
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes._sockets import bound_socket

MAX = 1024


@functools.cache
def _bomb() -> bytes:
    return gzip.compress(b"0" * (64 << 20), compresslevel=9)


class ToolApi(LoopbackServer):
    """A third-party JSON API a user points a tool at; each path answers one way."""

    label = "tool-api"

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        path = request.path
        if path == "/missing-big":
            await self.send_body(send, 404, b"x" * 5000, [("Content-Type", "text/plain")])
        elif path == "/missing":
            await self.send_body(send, 404, b"no such city", [("Content-Type", "text/plain")])
        elif path == "/empty-error":
            await self.send_body(send, 503, b"", [])
        elif path == "/redirect":
            await self.send_body(send, 302, b"", [("Location", f"{self.url}/target")])
        elif path == "/big":
            frames = (b"a" * 65536 for _ in range(128))  # 8 MiB, chunked
            await self.send_stream(send, [("Content-Type", "text/plain")], frames)
        elif path == "/utf8":
            body = ("\u00e9" * 1000).encode()
            await self.send_body(send, 200, body, [("Content-Type", "text/plain; charset=utf-8")])
        elif path == "/bomb":
            # Asked for identity, a server compresses anyway: 64 MiB of zeros in ~64 KiB.
            body = _bomb()
            headers = [("Content-Type", "text/plain"), ("Content-Encoding", "gzip")]
            await self.send_body(send, 200, body, headers)
        elif path == "/slow":
            await asyncio.sleep(3)
            await self.send_json(send, 200, {"late": True})
        elif path == "/trickle":
            # A byte at a time, each well inside the read timeout: only a total deadline ends it.
            frames = [b"." for _ in range(40)]
            await self.send_stream(send, [("Content-Type", "text/plain")], frames, delay_s=0.1)
        else:
            await self.send_json(send, 200, {"ok": True, "path": path})


@pytest.fixture
async def api() -> AsyncIterator[ToolApi]:
    async with ToolApi() as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # Room for a loaded machine; the timeout tests give their own short limits.
    settings = Settings.load(
        environ={}, outbound_allowed_cidrs=["127.0.0.0/8"], http_tool_timeout_s=15.0
    )
    async with http_tools_client(settings) as c:
        yield c


def _tool(url: str, method: str = "GET", **extra: Any) -> HttpTool:
    properties = {
        name: {"type": "string"} for name in ("city", "units", "days", "hourly", "tags", "skip")
    }
    return HttpTool(
        id="http-1",
        user_uuid="u-1",
        name="weather",
        description="The weather",
        parameters={"type": "object", "properties": properties},
        method=method,  # type: ignore[arg-type]
        url=url,
        **extra,
    )


async def test_placeholders_are_filled_url_encoded(api: ToolApi, client: httpx.AsyncClient) -> None:
    tool = _tool(f"{api.url}/cities/{{city}}/weather?units={{units}}")
    out = await call_http_tool(tool, {"city": "a b/c", "units": "m&x=1"}, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.method == "GET"
    assert request.raw_path == "/cities/a%20b%2Fc/weather"
    assert request.query == "units=m%26x%3D1"  # no argument left over: nothing appended
    assert json.loads(out.text) == {"ok": True, "path": "/cities/a b/c/weather"}


@pytest.mark.parametrize(
    ("template", "arguments", "named"),
    [
        ("/users/{city}/profile", {"city": ".."}, "'city'"),
        ("/users/{city}/profile", {"city": "."}, "'city'"),
        ("/users/{city}", {"city": ".."}, "'city'"),
        ("/{city}{units}/x", {"city": ".", "units": "."}, "'city' and 'units'"),
    ],
)
async def test_a_dot_segment_value_in_the_path_sends_nothing(
    api: ToolApi, client: httpx.AsyncClient, template: str, arguments: dict[str, str], named: str
) -> None:
    """`quote("..")` is `..`, and the client resolves `/users/../profile` to `/profile`: the
    call (with the tool's secret headers) would go where the tool never pointed."""
    tool = _tool(f"{api.url}{template}", headers={"Authorization": "Bearer t0k"})
    out = await call_http_tool(tool, arguments, client, MAX)
    assert out.is_error, out.text
    assert named in out.text and "path segment" in out.text
    assert api.requests == []


async def test_dots_elsewhere_are_plain_values(api: ToolApi, client: httpx.AsyncClient) -> None:
    tool = _tool(f"{api.url}/users/{{city}}/x{{units}}?q={{days}}")
    out = await call_http_tool(tool, {"city": "...", "units": "..", "days": ".."}, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.raw_path == "/users/.../x.."
    assert request.query == "q=.."
    out = await call_http_tool(tool, {"city": "../admin", "units": "", "days": 1}, client, MAX)
    assert not out.is_error, out.text
    assert api.requests[1].raw_path == "/users/..%2Fadmin/x"


async def test_a_missing_placeholder_argument_sends_nothing(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    tool = _tool(f"{api.url}/cities/{{city}}")
    out = await call_http_tool(tool, {"units": "metric"}, client, MAX)
    assert out.is_error
    assert "'city'" in out.text
    assert (await call_http_tool(tool, {"city": None}, client, MAX)).is_error
    assert api.requests == []


async def test_get_arguments_not_in_the_url_go_in_the_query(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    tool = _tool(f"{api.url}/cities/{{city}}?lang=en")
    arguments = {
        "city": "Paris",
        "units": "metric & more",
        "days": 3,
        "hourly": True,
        "tags": ["a", "b"],
        "skip": None,
    }
    out = await call_http_tool(tool, arguments, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.raw_path == "/cities/Paris"
    assert parse_qsl(request.query) == [
        ("lang", "en"),
        ("units", "metric & more"),
        ("days", "3"),
        ("hourly", "true"),
        ("tags", '["a","b"]'),
    ]
    assert request.raw == b""
    assert "content-type" not in request.headers


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_body_methods_send_the_other_arguments_as_json(
    api: ToolApi, client: httpx.AsyncClient, method: str
) -> None:
    tool = _tool(f"{api.url}/cities/{{city}}", method=method)
    arguments = {"city": "Oslo", "days": 3, "tags": ["a", "é"], "skip": None}
    out = await call_http_tool(tool, arguments, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.method == method
    assert request.raw_path == "/cities/Oslo"
    assert request.query == ""
    assert request.headers["content-type"] == "application/json"
    assert request.json == {"days": 3, "tags": ["a", "é"], "skip": None}
    assert int(request.headers["content-length"]) == len(request.raw)


async def test_the_tools_headers_reach_the_server(api: ToolApi, client: httpx.AsyncClient) -> None:
    secret = {"X-Api-Key": "s3cret", "Authorization": "Bearer tok"}
    out = await call_http_tool(_tool(f"{api.url}/x", headers=secret), {}, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.headers["x-api-key"] == "s3cret"
    assert request.headers["authorization"] == "Bearer tok"
    assert request.headers["user-agent"] == USER_AGENT
    assert request.headers["accept"] == ACCEPT
    assert request.headers["host"] == f"127.0.0.1:{api.port}"
    assert "s3cret" not in out.text


async def test_the_tools_headers_replace_the_defaults(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    headers = {
        "user-agent": "my-agent/1",
        "ACCEPT": "text/csv",
        "Content-Type": "application/x+json",
    }
    tool = _tool(f"{api.url}/x", method="POST", headers=headers)
    out = await call_http_tool(tool, {"city": "x"}, client, MAX)
    assert not out.is_error, out.text
    [request] = api.requests
    assert request.headers["user-agent"] == "my-agent/1"
    assert request.headers["accept"] == "text/csv"
    assert request.headers["content-type"] == "application/x+json"


async def test_a_404_is_an_error_result_with_its_body(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    out = await call_http_tool(_tool(f"{api.url}/missing"), {}, client, MAX)
    assert out.is_error
    assert out.text == "HTTP 404: no such city"
    # A long error body is cut with the status inside the limit.
    big = await call_http_tool(_tool(f"{api.url}/missing-big"), {}, client, MAX)
    assert big.is_error and big.text.startswith("HTTP 404: xxx")
    assert len(big.text.encode()) <= MAX
    head, note = big.text.split("\n", 1)
    kept = len(head) - len("HTTP 404: ")
    assert note == f"[... {5000 - kept} more bytes cut (tool_result_max_bytes)]"
    empty = await call_http_tool(_tool(f"{api.url}/empty-error"), {}, client, MAX)
    assert empty.is_error
    assert empty.text == "HTTP 503 Service Unavailable"


async def test_a_redirect_is_not_followed(api: ToolApi, client: httpx.AsyncClient) -> None:
    out = await call_http_tool(_tool(f"{api.url}/redirect"), {}, client, MAX)
    assert out.is_error
    assert out.text.startswith("HTTP 302: redirects are not followed")
    assert f"{api.url}/target" in out.text
    assert [r.path for r in api.requests] == ["/redirect"]


async def test_a_big_body_is_cut_at_max_bytes(api: ToolApi, client: httpx.AsyncClient) -> None:
    tracemalloc.start()
    try:
        out = await call_http_tool(_tool(f"{api.url}/big"), {}, client, MAX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # the body is 8 MiB: never all of it in memory
    assert not out.is_error
    # The note is inside the limit: what the model gets is not cut again by the runner.
    assert len(out.text.encode()) <= MAX
    body, note = out.text.split("\n", 1)
    assert body == "a" * len(body) and len(body) > MAX - 100
    # Chunked, read no further than the limit: how much more there was is not known.
    assert note == "[... the answer was longer than tool_result_max_bytes: the rest was cut]"


async def test_a_cut_through_a_character_drops_it(api: ToolApi, client: httpx.AsyncClient) -> None:
    out = await call_http_tool(_tool(f"{api.url}/utf8"), {}, client, MAX + 1)
    assert len(out.text.encode()) <= MAX + 1
    body, note = out.text.split("\n", 1)
    assert body == "\u00e9" * len(body) and len(body) > (MAX - 100) // 2  # whole characters
    # The answer gave its length (2,000 bytes): the note says how much was cut.
    assert note == f"[... {2000 - 2 * len(body)} more bytes cut (tool_result_max_bytes)]"
    whole = await call_http_tool(_tool(f"{api.url}/utf8"), {}, client, 2000)
    assert whole.text == "\u00e9" * 1000


async def test_a_compressed_body_is_cut_while_decompressing(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    _bomb()  # made before measuring
    tracemalloc.start()
    try:
        out = await call_http_tool(_tool(f"{api.url}/bomb"), {}, client, MAX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not out.is_error, out.text[:200]
    assert peak < 8 << 20  # never the 64 MiB the body inflates to
    note = "\n[... the answer was longer than tool_result_max_bytes: the rest was cut]"
    assert out.text == "0" * (MAX - len(note)) + note
    assert api.requests[0].headers["accept-encoding"] == "identity"


async def test_a_refused_destination_sends_nothing(api: ToolApi) -> None:
    closed = Settings.load(environ={}, outbound_allowed_cidrs=[], http_tool_timeout_s=1.0)
    async with http_tools_client(closed) as guarded:
        for host in ("127.0.0.1", "localhost"):
            tool = _tool(f"http://{host}:{api.port}/x")
            out = await call_http_tool(tool, {}, guarded, MAX)
            assert out.is_error
            assert out.text.startswith("destination not allowed"), out.text
    assert api.requests == []


async def test_a_slow_server_is_a_timeout(api: ToolApi, client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    out = await call_http_tool(_tool(f"{api.url}/slow"), {}, client, MAX, timeout_s=1.0)
    assert out.is_error
    assert "timed out" in out.text
    assert time.monotonic() - started < 2.5


async def test_a_trickling_body_meets_the_total_deadline(
    api: ToolApi, client: httpx.AsyncClient
) -> None:
    started = time.monotonic()
    out = await call_http_tool(_tool(f"{api.url}/trickle"), {}, client, MAX, timeout_s=0.5)
    assert out.is_error
    assert out.text == "the request timed out after 0.5 s"
    assert time.monotonic() - started < 2.0


async def test_a_refused_connection_is_an_error_result(client: httpx.AsyncClient) -> None:
    sock = bound_socket()  # bound, never listening: the connect is refused
    port = sock.getsockname()[1]
    try:
        out = await call_http_tool(_tool(f"http://127.0.0.1:{port}/x"), {}, client, MAX)
    finally:
        sock.close()
    assert out.is_error
    assert out.text.startswith("could not connect"), out.text
