"""A real MCP server for tests, built with the official SDK's server side (PyPI `mcp` 2.3.0,
`mcp.server.mcpserver.MCPServer`, formerly FastMCP): the wire (JSON-RPC framing, the
streamable HTTP transport at `/mcp` with its `Mcp-Session-Id` sessions and SSE answers, the
stdio transport's newline-delimited JSON) is the SDK's own, not a hand-written imitation.

    python -m tests.fakes.mcp_server --http --port N [--legacy] [--record PATH]
        [--require-header Authorization='Bearer x']
    python -m tests.fakes.mcp_server --stdio [--record PATH]

Over HTTP it speaks both protocol eras as the SDK does (2026-07-28 per request, stateless;
2025-11-25 and older after `initialize`, in a session), or with `--legacy` only the older one,
refusing a 2026 request with 400 as a 2025-era server does: most deployed servers are of
that era, and only there does a restarted server forget sessions (404).

Tools: `echo(text)`, `add(a, b)`, `fail(message)` (an `isError` result), `slow(seconds)`,
`whoami()` (which headers arrived and whether each `--require-header` matched, never their
values; and the server's pid). With `--record PATH` every call appends a JSON line
`{"tool", "arguments", "pid"}` before the tool runs. With `--require-header NAME=VALUE` a
request without that header value is answered `401` with the `WWW-Authenticate: Bearer`
challenge and body of the SDK's own bearer-auth middleware.

`McpServerProcess` runs the HTTP server in a subprocess on a fixed loopback port, so a test
can kill it and start it again at the same URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

__all__ = ["McpServerProcess", "build_server"]

ROOT = Path(__file__).resolve().parents[2]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def build_server(record: Path | None, required: dict[str, str]) -> MCPServer:
    server = MCPServer("fake-mcp", version="1.0", log_level="WARNING")

    def note(tool: str, arguments: dict[str, Any]) -> None:
        if record is not None:
            line = json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()})
            with record.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    @server.tool()
    def echo(text: str) -> str:
        """Returns the text."""
        note("echo", {"text": text})
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        note("add", {"a": a, "b": b})
        return a + b

    @server.tool()
    def fail(message: str) -> str:
        """Fails with the message (an isError result)."""
        note("fail", {"message": message})
        raise ToolError(message)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleeps, then answers."""
        note("slow", {"seconds": seconds})
        await asyncio.sleep(seconds)
        return f"slept {seconds}s"

    @server.tool()
    def whoami(ctx: Context) -> str:
        """Which headers arrived (names only) and whether the required ones matched."""
        note("whoami", {})
        headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
        return json.dumps(
            {
                "pid": os.getpid(),
                "headers": sorted(headers),
                "required": {
                    name: "matched" if headers.get(name) == value else "absent or different"
                    for name, value in required.items()
                },
            }
        )

    return server


def require_headers(app: App, required: dict[str, str]) -> App:
    """401 for a request without every required header value, as the SDK's
    `RequireAuthMiddleware` answers (its challenge and body)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            got = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if any(got.get(name) != value for name, value in required.items()):
                body = json.dumps(
                    {"error": "invalid_token", "error_description": "Authentication required"}
                ).encode()
                challenge = (
                    'Bearer error="invalid_token", error_description="Authentication required"'
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", challenge.encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def legacy_only(app: App) -> App:
    """A 2025-era server: a request naming a protocol version it does not know is answered
    400 with a JSON-RPC error (mcp 1.x's answer), which sends a 2.x client to `initialize`."""

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            version = headers.get("mcp-protocol-version")
            if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
                message = (
                    f"Bad Request: Unsupported protocol version: {version}. "
                    f"Supported versions: {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}"
                )
                body = json.dumps(
                    {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return gated


def _header_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name.strip().lower(), value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.mcp_server")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--http", action="store_true")
    mode.add_argument("--stdio", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--record", type=Path)
    parser.add_argument("--require-header", type=_header_pair, action="append", default=[])
    args = parser.parse_args(argv)
    required = dict(args.require_header)
    server = build_server(args.record, required)
    if args.stdio:
        server.run("stdio")
        return
    import uvicorn

    app: App = server.streamable_http_app()
    if args.legacy:
        app = legacy_only(app)
    if required:
        app = require_headers(app, required)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class McpServerProcess:
    """The HTTP server in a subprocess on one loopback port for its whole life:

    with McpServerProcess(record=tmp_path / "calls.jsonl") as server:
        server.url            # http://127.0.0.1:<port>/mcp
        server.kill()         # SIGKILL, as a crash
        server.start()        # again, same port; returns once it answers
        server.calls()        # the recorded calls, oldest first
    """

    def __init__(
        self,
        *,
        record: Path | None = None,
        require_header: tuple[str, str] | None = None,
        legacy: bool = False,
        port: int | None = None,
    ) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.record = record
        self._argv = [sys.executable, "-m", "tests.fakes.mcp_server", "--http"]
        self._argv += ["--port", str(self.port)]
        if legacy:
            self._argv.append("--legacy")
        if record is not None:
            self._argv += ["--record", str(record)]
        if require_header is not None:
            self._argv += ["--require-header", "=".join(require_header)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("already running")
        self.process = subprocess.Popen(self._argv, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"the MCP server exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"the MCP server did not answer on port {self.port}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        """Whether an HTTP request to the port gets any HTTP answer."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                return sock.recv(16).startswith(b"HTTP/1.1 ")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def calls(self) -> list[dict[str, Any]]:
        if self.record is None or not self.record.exists():
            return []
        lines = self.record.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line]

    def __enter__(self) -> McpServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


if __name__ == "__main__":
    main()
