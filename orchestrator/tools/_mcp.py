"""The client side of MCP servers users register: one open session per server (and version of
its settings) per process, shared by every agent task of that process, through the official
SDK (`mcp` 2.x: `mcp.client.client.Client` over `streamable_http_client` or `stdio_client`).

Why the shape:

- The SDK's transports and sessions are anyio context managers whose task groups must be
  exited by the task that entered them, so each connection lives in its own task
  (`_Connection._own`) that enters them, waits, and leaves them when told; calls from other
  tasks use the session, which the SDK allows.
- A server that restarted has forgotten its sessions (HTTP 404 to the session id) and a stdio
  child that died has closed its pipe. A call then reconnects and is sent once more, but only
  when it cannot have run: it never reached the transport, its HTTP request could not connect,
  or the server answered 404 to the session before any 2xx. What each attempt's requests met
  is noted through a context variable the SDK carries into the tasks that send them
  (`_Attempt`). A timeout is never retried.
- HTTP goes out through the egress guard (`outbound_allowed_cidrs`); stdio only runs commands
  the operator listed (`mcp_stdio_commands`), and a child's stderr goes to /dev/null: it would
  land in the worker's log (Ray's), and a server that prints its environment would leak the
  env values set for it.
- A session unused for IDLE_CLOSE_S is closed by a sweeper that runs while the pool holds
  sessions (a deleted server's session on a worker, a stdio child no task uses). Listing a
  server's tools for the API (registration, refresh) uses a session of its own, closed at
  once: an API replica keeps no stdio child or open stream, and no task's session is touched.
- Header and env values are secrets: sent, never put in a message (`_scrub`) or a log line.
  Nothing the SDK logs holds a request header: httpx2 logs each request's URL (INFO),
  httpcore2 its method and the response's headers (DEBUG), the SDK the JSON-RPC messages.
- A tool call never raises for the server's faults: every failure is an error result the model
  reads. Only the caller's cancellation propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp.types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import ValidationError

from orchestrator.agents._tools import cut_utf8
from orchestrator.config import Settings
from orchestrator.egress import Httpx2DestinationNotAllowed, httpx2_egress_client
from orchestrator.observability import REDACTED
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.tools._model import CallOutcome, McpServer, McpToolInfo

__all__ = ["McpPool", "McpUnavailable"]

log = logging.getLogger(__name__)

_CLIENT_INFO = types.Implementation(name="orchestrator", version="0.1.0")
_CLOSE_GRACE_S = 8.0  # the SDK's stdio shutdown: 2 s after stdin closes, 2 s TERM, 2 s KILL
IDLE_CLOSE_S = 600.0  # a session unused this long is closed (by the sweeper, or the next use)
SWEEP_S = 60.0  # how often the sweeper looks for idle sessions
_MAX_PAGES = 100  # tools/list pages: a server paginating forever cannot hang a listing


class McpUnavailable(Exception):
    """A server could not be reached or listed. The message is safe to show to the user: it
    names the server and its origin or command, never a header or env value."""


@dataclass
class _Attempt:
    """What one call's requests met, noted by the transports as they go."""

    call_written: bool = False  # the tools/call request was handed to the transport
    answered: bool = False  # some HTTP request of this attempt got a 2xx: it may have run
    not_sent: bool = False  # an HTTP request could not connect
    session_unknown: bool = False  # the server answered 404 to our session id

    def not_executed(self, exc: Exception) -> bool:
        """Whether the call's failure `exc` shows the server cannot have run it."""
        if not self.call_written:  # the session was closed before it could be sent
            return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED
        return not self.answered and (self.not_sent or self.session_unknown)


_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "mcp_attempt", default=None
)


class _Watch(httpx2.AsyncBaseTransport):
    """Behind the egress guard: notes what each request met, for its attempt and connection."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        attempt = _ATTEMPT.get()
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout):
            if attempt is not None:
                attempt.not_sent = True
            raise
        status = response.status_code
        if status == 404 and "mcp-session-id" in request.headers:
            self._conn.lost = True
            if attempt is not None:
                attempt.session_unknown = True
        elif status >= 400:
            self._conn.http_status = status
        elif 200 <= status < 300:
            self._conn.http_status = None  # a refusal before (the era probe's 400) is past
            if attempt is not None:
                attempt.answered = True
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ReadWatch:
    """The read side of a transport: its end means the server is gone (EOF of a stdio child,
    the HTTP transport torn down)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> contextvars.Context | None:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise
        return item

    def __aiter__(self) -> _ReadWatch:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _ReadWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _WriteWatch:
    """The write side: notes that the attempt's tools/call was handed to the transport."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage) -> None:
        await self._inner.send(item)
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "tools/call":
            attempt = _ATTEMPT.get()
            if attempt is not None:
                attempt.call_written = True

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WriteWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _watched(
    transport: contextlib.AbstractAsyncContextManager[Any], on_end: Callable[[], None]
) -> AsyncIterator[Any]:
    async with transport as (read, write):
        yield _ReadWatch(read, on_end), _WriteWatch(write)


class _Connection:
    """One session to one version of one server, owned by its own task."""

    def __init__(self, server: McpServer, settings: Settings) -> None:
        self.server = server
        self._settings = settings
        self.client: Client | None = None
        self.failure: BaseException | None = None
        self.lost = False  # the server forgot the session (404)
        self.http_status: int | None = None  # the HTTP error status of its last answer
        self.used = time.monotonic()  # the last time a call or a listing took it
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._ended = asyncio.Event()
        self._task = asyncio.create_task(self._own(), name=f"mcp {server.id}/{server.version}")

    @property
    def dead(self) -> bool:
        return self.lost or self._stop.is_set() or self._ended.is_set()

    async def ready(self) -> Client:
        await self._ready.wait()
        if self.client is None or self._ended.is_set():
            raise McpUnavailable(self.unavailable())
        return self.client

    async def close(self) -> None:
        self._stop.set()
        if self._ready.is_set():  # connected: it closes gracefully, given the time
            await asyncio.wait({self._task}, timeout=_CLOSE_GRACE_S)
        await cancel_and_wait([self._task])  # still connecting, or past the grace

    async def _own(self) -> None:
        limit = self._settings.mcp_connect_timeout_s
        watchdog = asyncio.get_running_loop().call_later(limit, self._expire)
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = Client(
                    _watched(transport, self._stop.set),
                    mode="auto",
                    cache=None,
                    client_info=_CLIENT_INFO,
                )
                await stack.enter_async_context(client)
                watchdog.cancel()
                self.client = client
                self._ready.set()
                log.debug("MCP server %s (%s) connected", self.server.id, self.server.name)
                await self._stop.wait()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the task is ours: its end is recorded
            if self.failure is None:
                self.failure = exc
            if self.client is not None and not self._stop.is_set():
                log.info("MCP server %s (%s) connection ended", self.server.id, self.server.name)
        finally:
            watchdog.cancel()
            self._ended.set()
            self._ready.set()

    def _expire(self) -> None:
        if not self._ready.is_set():
            self.failure = TimeoutError()
            self._task.cancel()

    async def _transport(
        self, stack: contextlib.AsyncExitStack
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.transport == "stdio":
            params = StdioServerParameters(
                command=server.command or "", args=list(server.args), env=dict(server.env)
            )
            # The child's stderr: not the worker's (its log), where the server's own output
            # (its environment, a token in a traceback) would be kept.
            devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: ASYNC230 - never blocks
            errlog = stack.enter_context(devnull)
            return stdio_client(params, errlog=errlog)
        limit = self._settings.mcp_connect_timeout_s
        # No read timeout: a tool may think for long; each call is bounded by its own timeout.
        timeout = httpx2.Timeout(limit, read=None, pool=None)
        http = httpx2_egress_client(
            self._settings.outbound_allowed_cidrs,
            timeout,
            headers=server.headers,
            inner=_Watch(self),
        )
        await stack.enter_async_context(http)
        return streamable_http_client(server.url or "", http_client=http)

    def unavailable(self, exc: BaseException | None = None) -> str:
        """Why the connection (or `exc` on it) failed, for the user."""
        exc = exc if exc is not None else self.failure
        server, limit = self.server, self._settings.mcp_connect_timeout_s
        where = _where(server)
        if isinstance(exc, McpUnavailable):
            reason = str(exc)
        elif _find(exc, Httpx2DestinationNotAllowed) is not None:
            reason = (
                f"the destination {where} is not allowed: it is a private or internal address "
                "(outbound_allowed_cidrs opens such ranges)"
            )
        elif isinstance(exc, TimeoutError) or _find(exc, httpx2.TimeoutException) is not None:
            reason = f"did not answer within {limit:g}s"
        elif (connect := _find(exc, httpx2.ConnectError)) is not None:
            reason = f"cannot connect to {where} ({connect})"
        elif self.http_status is not None:
            reason = f"{where} answered HTTP {self.http_status}"
            if self.http_status in (401, 403):
                reason += " (check the server's headers: its credentials were refused)"
        elif (error := _find(exc, MCPError)) is not None and error.code == CONNECTION_CLOSED:
            reason = f"{where} closed the connection before answering"
            if server.transport == "stdio":
                reason += " (the command exited, or is not an MCP server)"
        elif error is not None:
            reason = f"protocol error: {error.message} (code {error.code})"
        elif (os_error := _find(exc, OSError)) is not None:
            reason = f"cannot start {where}: {os_error.strerror or type(os_error).__name__}"
        else:
            reason = f"the connection failed ({type(exc).__name__})"
        return _scrub(f"MCP server {server.name!r} is unavailable: {reason}", server)


class McpPool:
    """This process's open MCP sessions, keyed by (server id, server version)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conns: dict[tuple[str, int], _Connection] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def list_tools(self, server: McpServer, *, keep: bool = True) -> tuple[McpToolInfo, ...]:
        """Every tool the server lists (all pages). Raises McpUnavailable when it cannot be
        reached, is refused, errs or takes longer than `mcp_connect_timeout_s` in all.
        `keep=False`: on a session of its own, closed right after (the API's listings: the
        process keeps nothing open for them, and the pooled sessions its tasks use, if it
        runs any, are left alone)."""
        limit = self._settings.mcp_connect_timeout_s
        try:
            async with asyncio.timeout(limit):
                if not keep:
                    return await self._list_once(server)
                return await self._list_tools(server)
        except TimeoutError:
            message = f"MCP server {server.name!r} is unavailable: did not answer within {limit:g}s"
            raise McpUnavailable(message) from None

    async def call(
        self,
        server: McpServer,
        tool: str,
        arguments: dict[str, Any],
        timeout: float | None = None,  # noqa: ASYNC109 - the call's own limit, in its error text
    ) -> CallOutcome:
        """Call `tool`: its result's text, cut at `tool_result_max_bytes`; any failure of
        the server (unreachable, protocol error, no answer within `timeout` or
        `mcp_call_timeout_s`) is an error outcome saying what happened."""
        limit = timeout if timeout is not None else self._settings.mcp_call_timeout_s
        return await self._call(server, tool, arguments, limit)

    def forget(self, server_id: str) -> None:
        """Close this process's sessions to a server (deleted): its stdio child ends too."""
        for key, conn in list(self._conns.items()):
            if key[0] == server_id:
                self._retire(conn)

    async def aclose(self) -> None:
        """Close every session (a stdio child ends with its session)."""
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
            self._sweeper = None
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns), *self._closing)

    async def _list_once(self, server: McpServer) -> tuple[McpToolInfo, ...]:
        self._check(server)
        conn = _Connection(server, self._settings)
        try:
            client = await conn.ready()
            try:
                return await _all_tools(client)
            except Exception as exc:  # noqa: BLE001 - any failure of the server is McpUnavailable
                raise McpUnavailable(conn.unavailable(exc)) from None
        finally:
            self._retire(conn)  # closed in the background: a stdio child takes seconds to end

    async def _list_tools(self, server: McpServer) -> tuple[McpToolInfo, ...]:
        for first in (True, False):
            conn, fresh = self._connection(server)
            client = await self._ready(conn)
            try:
                return await _all_tools(client)
            except Exception as exc:  # noqa: BLE001 - any failure of the server is McpUnavailable
                if conn.dead:
                    self._retire(conn)
                    if first and not fresh:  # a pooled session the server had dropped
                        continue
                raise McpUnavailable(conn.unavailable(exc)) from None
        raise AssertionError("unreachable")

    async def _call(
        self, server: McpServer, tool: str, arguments: dict[str, Any], limit: float
    ) -> CallOutcome:
        """`limit` bounds the call itself; reaching the server (a stdio command starting, a
        handshake) has `mcp_connect_timeout_s` of its own, so a slow start is not reported
        as a tool that did not answer."""
        for first in (True, False):
            try:
                conn, _ = self._connection(server)
                client = await self._ready(conn)
            except McpUnavailable as exc:
                return CallOutcome(f"error: {exc}", is_error=True)
            attempt = _Attempt()
            token = _ATTEMPT.set(attempt)
            try:
                async with asyncio.timeout(limit):
                    result = await client.call_tool(tool, arguments)
            except TimeoutError:
                text = f"error: MCP server {server.name!r} did not answer within {limit:g}s"
                return CallOutcome(text, is_error=True)
            except Exception as exc:  # noqa: BLE001 - a server's fault is the model's error result
                not_executed = attempt.not_executed(exc)
                if conn.dead or not_executed:
                    self._retire(conn)
                if first and not_executed:
                    log.info("MCP server %s: reconnecting to send %s again", server.id, tool)
                    continue
                return CallOutcome(_call_error(server, exc), is_error=True)
            finally:
                _ATTEMPT.reset(token)
            return _outcome(result, self._settings.tool_result_max_bytes)
        raise AssertionError("unreachable")

    def _connection(self, server: McpServer) -> tuple[_Connection, bool]:
        """The pooled connection to this version of the server, or a new one (and whether it
        is new). No await between the lookup and the insert: one connection per key."""
        now = time.monotonic()
        for (sid, version), pooled in list(self._conns.items()):
            if sid == server.id and version < server.version:  # an older version of it
                self._retire(pooled)
        self._retire_idle(now)
        key = (server.id, server.version)
        conn = self._conns.get(key)
        if conn is not None and not conn.dead:
            conn.used = now
            return conn, False
        if conn is not None:
            self._retire(conn)
        self._check(server)
        conn = _Connection(server, self._settings)
        self._conns[key] = conn
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="mcp idle sweeper")
        return conn, True

    def _check(self, server: McpServer) -> None:
        """Raise McpUnavailable for a server this process may not connect to."""
        if server.transport == "stdio" and server.command not in self._settings.mcp_stdio_commands:
            raise McpUnavailable(
                _scrub(
                    f"MCP server {server.name!r} is unavailable: command {server.command!r} "
                    "not allowed (not in mcp_stdio_commands)",
                    server,
                )
            )
        scheme = urlsplit(server.url or "").scheme
        if server.transport == "streamable_http" and scheme not in ("http", "https"):
            raise McpUnavailable(f"MCP server {server.name!r} is unavailable: not an http(s) URL")

    def _retire_idle(self, now: float) -> None:
        """Close the sessions idle for long: a server deleted elsewhere, one no task uses now
        (its stdio child need not run on). "Long" is past any call's timeout too."""
        idle = max(IDLE_CLOSE_S, self._settings.mcp_call_timeout_s + 60)
        for pooled in list(self._conns.values()):
            if now - pooled.used > idle:
                self._retire(pooled)

    async def _sweep(self) -> None:
        """Retire idle sessions every SWEEP_S while the pool holds any (a pool nobody uses
        again would otherwise keep them, and their children, for good)."""
        while self._conns:
            await asyncio.sleep(SWEEP_S)
            self._retire_idle(time.monotonic())

    async def _ready(self, conn: _Connection) -> Client:
        try:
            return await conn.ready()
        except McpUnavailable:
            self._retire(conn)
            raise

    def _retire(self, conn: _Connection) -> None:
        key = (conn.server.id, conn.server.version)
        if self._conns.get(key) is conn:
            del self._conns[key]
        task = asyncio.create_task(conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


async def _all_tools(client: Client) -> tuple[McpToolInfo, ...]:
    tools: dict[str, McpToolInfo] = {}
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        for t in page.tools:
            tools.setdefault(t.name, McpToolInfo(t.name, t.description or "", t.input_schema))
        cursor = page.next_cursor
        if cursor is None:
            break
    return tuple(tools.values())


def _outcome(result: types.CallToolResult, max_bytes: int) -> CallOutcome:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(res.text)
            else:
                mime = res.mime_type or "application/octet-stream"
                parts.append(f"[resource: {res.uri}, {mime}, {_decoded_size(res.blob)} bytes]")
    has_text = any(isinstance(b, types.TextContent) for b in result.content)
    if not has_text and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return CallOutcome(cut_utf8("\n".join(parts), max_bytes), is_error=result.is_error)


def _decoded_size(b64: str) -> int:
    data = b64.strip()
    return max(0, len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))))


def _call_error(server: McpServer, exc: Exception) -> str:
    name = server.name
    if isinstance(exc, MCPError):
        if exc.code == CONNECTION_CLOSED:
            text = f"error: MCP server {name!r} closed the connection before answering"
        elif exc.code == REQUEST_TIMEOUT:
            text = f"error: MCP server {name!r} did not answer in time"
        else:
            error = f"{exc.message} (code {exc.code})"
            text = f"error: MCP server {name!r} answered with an error: {error}"
    elif isinstance(exc, ValidationError):
        text = f"error: MCP server {name!r} answered with a result that is not valid MCP"
    elif isinstance(exc, httpx2.HTTPError):
        text = f"error: MCP server {name!r} failed: {type(exc).__name__}: {exc}"
    else:
        text = f"error: MCP server {name!r} failed: {exc or type(exc).__name__}"
    return _scrub(text, server)


def _where(server: McpServer) -> str:
    """The server's origin (no userinfo, path or query) or its command."""
    if server.transport == "stdio":
        return f"command {server.command!r}"
    parts = urlsplit(server.url or "")
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _scrub(text: str, server: McpServer) -> str:
    """`text` without any header or env value of `server` (nor a long word of one: the token
    of `Bearer <token>`)."""
    secrets: set[str] = set()
    for value in (*server.headers.values(), *server.env.values()):
        if len(value) >= 4:
            secrets.add(value)
        secrets.update(w for w in value.split() if len(w) >= 6)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _find(exc: BaseException | None, kind: type[Any]) -> Any:
    """The first exception of `kind` in `exc`, its groups and its causes."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        if isinstance(e, BaseExceptionGroup):
            stack.extend(reversed(e.exceptions))
        stack.extend((e.__cause__, e.__context__))
    return None
