"""The agent-tool methods of both clients (MCP servers, HTTP tools, tool policies, the tools a
user's agents can use), as mixins: `Client` and `AsyncClient` would otherwise each pass 800
lines. Each method sends the `Call` _tool_calls.py describes through the client's `_send`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from orchestrator.sdk import _tool_calls
from orchestrator.sdk._tool_models import (
    HttpTool,
    HttpToolList,
    McpServer,
    McpServerList,
    ToolDeleted,
    ToolList,
    ToolPolicy,
)

if TYPE_CHECKING:
    from orchestrator.sdk._base import Call

__all__ = ["AsyncToolMethods", "ToolMethods"]

T = TypeVar("T")
Scope = Literal["user", "global"]


class ToolMethods:
    """Agent tools, for the blocking `Client`."""

    if TYPE_CHECKING:

        def _send(self, call: Call[T]) -> T: ...

    def tools(self) -> ToolList:
        """Every tool the caller's agents can use (built-in, memory, workspace, MCP, HTTP,
        marketplace), by the name a step's `tools` gives."""
        return self._send(_tool_calls.tools())

    def mcp_servers(self) -> McpServerList:
        """Your MCP servers, then the shared ones."""
        return self._send(_tool_calls.mcp_servers())

    def create_mcp_server(
        self,
        name: str,
        url: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        command: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        shared: bool = False,
    ) -> McpServer:
        """Register a streamable-HTTP server (`url`, `headers`: secrets) or, as an admin, a
        stdio one (`command`, `args`, `env`); admins may make it `shared`. Its `status` says
        whether its tools could be listed."""
        call = _tool_calls.create_mcp_server(name, url, headers, command, args, env, shared)
        return self._send(call)

    def mcp_server(self, server_id: str) -> McpServer:
        return self._send(_tool_calls.mcp_server(server_id))

    def update_mcp_server(
        self,
        server_id: str,
        *,
        name: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        command: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        shared: bool | None = None,
    ) -> McpServer:
        """`headers` (`env`) given replace the stored ones (`***` keeps a stored value)."""
        call = _tool_calls.update_mcp_server(
            server_id, name, url, headers, command, args, env, shared
        )
        return self._send(call)

    def delete_mcp_server(self, server_id: str) -> ToolDeleted:
        return self._send(_tool_calls.delete_mcp_server(server_id))

    def refresh_mcp_server(self, server_id: str) -> McpServer:
        """List the server's tools again."""
        return self._send(_tool_calls.refresh_mcp_server(server_id))

    def http_tools(self) -> HttpToolList:
        return self._send(_tool_calls.http_tools())

    def create_http_tool(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> HttpTool:
        """Define `http__<name>`: `url` may hold `{param}` placeholders of `parameters`."""
        call = _tool_calls.create_http_tool(name, description, parameters, method, url, headers)
        return self._send(call)

    def http_tool(self, tool_id: str) -> HttpTool:
        return self._send(_tool_calls.http_tool(tool_id))

    def update_http_tool(
        self,
        tool_id: str,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        method: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpTool:
        call = _tool_calls.update_http_tool(
            tool_id, name, description, parameters, method, url, headers
        )
        return self._send(call)

    def delete_http_tool(self, tool_id: str) -> ToolDeleted:
        return self._send(_tool_calls.delete_http_tool(tool_id))

    def tool_policy(self, user_uuid: str | None = None, scope: Scope | None = None) -> ToolPolicy:
        """Your rules and the global ones; admins: another user's or the global rules."""
        return self._send(_tool_calls.tool_policy(user_uuid, scope))

    def set_tool_policy(
        self,
        rules: Sequence[Mapping[str, str]],
        user_uuid: str | None = None,
        scope: Scope | None = None,
    ) -> ToolPolicy:
        """Replace the rules (`[{"tool": glob, "action": "allow" | "deny"}]`) of a scope."""
        return self._send(_tool_calls.set_tool_policy(rules, user_uuid, scope))


class AsyncToolMethods:
    """Agent tools, for `AsyncClient`: the same methods as coroutines."""

    if TYPE_CHECKING:

        async def _send(self, call: Call[T]) -> T: ...

    async def tools(self) -> ToolList:
        """Every tool the caller's agents can use (built-in, memory, workspace, MCP, HTTP,
        marketplace), by the name a step's `tools` gives."""
        return await self._send(_tool_calls.tools())

    async def mcp_servers(self) -> McpServerList:
        """Your MCP servers, then the shared ones."""
        return await self._send(_tool_calls.mcp_servers())

    async def create_mcp_server(
        self,
        name: str,
        url: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        command: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        shared: bool = False,
    ) -> McpServer:
        """Register a streamable-HTTP server (`url`, `headers`: secrets) or, as an admin, a
        stdio one (`command`, `args`, `env`); admins may make it `shared`. Its `status` says
        whether its tools could be listed."""
        call = _tool_calls.create_mcp_server(name, url, headers, command, args, env, shared)
        return await self._send(call)

    async def mcp_server(self, server_id: str) -> McpServer:
        return await self._send(_tool_calls.mcp_server(server_id))

    async def update_mcp_server(
        self,
        server_id: str,
        *,
        name: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        command: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        shared: bool | None = None,
    ) -> McpServer:
        """`headers` (`env`) given replace the stored ones (`***` keeps a stored value)."""
        call = _tool_calls.update_mcp_server(
            server_id, name, url, headers, command, args, env, shared
        )
        return await self._send(call)

    async def delete_mcp_server(self, server_id: str) -> ToolDeleted:
        return await self._send(_tool_calls.delete_mcp_server(server_id))

    async def refresh_mcp_server(self, server_id: str) -> McpServer:
        """List the server's tools again."""
        return await self._send(_tool_calls.refresh_mcp_server(server_id))

    async def http_tools(self) -> HttpToolList:
        return await self._send(_tool_calls.http_tools())

    async def create_http_tool(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> HttpTool:
        """Define `http__<name>`: `url` may hold `{param}` placeholders of `parameters`."""
        call = _tool_calls.create_http_tool(name, description, parameters, method, url, headers)
        return await self._send(call)

    async def http_tool(self, tool_id: str) -> HttpTool:
        return await self._send(_tool_calls.http_tool(tool_id))

    async def update_http_tool(
        self,
        tool_id: str,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        method: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpTool:
        call = _tool_calls.update_http_tool(
            tool_id, name, description, parameters, method, url, headers
        )
        return await self._send(call)

    async def delete_http_tool(self, tool_id: str) -> ToolDeleted:
        return await self._send(_tool_calls.delete_http_tool(tool_id))

    async def tool_policy(
        self, user_uuid: str | None = None, scope: Scope | None = None
    ) -> ToolPolicy:
        """Your rules and the global ones; admins: another user's or the global rules."""
        return await self._send(_tool_calls.tool_policy(user_uuid, scope))

    async def set_tool_policy(
        self,
        rules: Sequence[Mapping[str, str]],
        user_uuid: str | None = None,
        scope: Scope | None = None,
    ) -> ToolPolicy:
        """Replace the rules (`[{"tool": glob, "action": "allow" | "deny"}]`) of a scope."""
        return await self._send(_tool_calls.set_tool_policy(rules, user_uuid, scope))
