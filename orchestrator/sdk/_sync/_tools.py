# Generated from orchestrator/sdk/_async/_tools.py by scripts/unasync_sdk.py: do not edit.
"""Agent tools: MCP servers, HTTP tools, tool policies, and the tools a user's agents can use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.sdk._base import Call, model_of
from orchestrator.sdk._requests import Scope, given, http_tool_body, mcp_server_body, seg
from orchestrator.sdk._sync._core import SyncCore
from orchestrator.wire import (
    HttpTool,
    HttpToolList,
    McpServer,
    McpServerList,
    ToolDeleted,
    ToolList,
    ToolPolicy,
)

__all__ = ["SyncTools"]


class SyncTools(SyncCore):
    def tools(self) -> ToolList:
        """Every tool the caller's agents can use (built-in, memory, workspace, MCP, HTTP,
        marketplace), by the name a step's `tools` gives."""
        return self._send(Call("GET", "/tools", model_of(ToolList)))

    def mcp_servers(self) -> McpServerList:
        """Your MCP servers, then the shared ones."""
        return self._send(Call("GET", "/mcp/servers", model_of(McpServerList)))

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
        body = mcp_server_body(name, url, headers, command, args, env, shared or None)
        return self._send(Call("POST", "/mcp/servers", model_of(McpServer), body=body))

    def mcp_server(self, server_id: str) -> McpServer:
        path = f"/mcp/servers/{seg(server_id)}"
        return self._send(Call("GET", path, model_of(McpServer)))

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
        body = mcp_server_body(name, url, headers, command, args, env, shared)
        path = f"/mcp/servers/{seg(server_id)}"
        return self._send(Call("PUT", path, model_of(McpServer), body=body))

    def delete_mcp_server(self, server_id: str) -> ToolDeleted:
        path = f"/mcp/servers/{seg(server_id)}"
        return self._send(Call("DELETE", path, model_of(ToolDeleted)))

    def refresh_mcp_server(self, server_id: str) -> McpServer:
        """List the server's tools again."""
        path = f"/mcp/servers/{seg(server_id)}/refresh"
        return self._send(Call("POST", path, model_of(McpServer)))

    def http_tools(self) -> HttpToolList:
        return self._send(Call("GET", "/tools/http", model_of(HttpToolList)))

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
        body = http_tool_body(name, description, parameters, method, url, headers)
        return self._send(Call("POST", "/tools/http", model_of(HttpTool), body=body))

    def http_tool(self, tool_id: str) -> HttpTool:
        return self._send(Call("GET", f"/tools/http/{seg(tool_id)}", model_of(HttpTool)))

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
        body = http_tool_body(name, description, parameters, method, url, headers)
        path = f"/tools/http/{seg(tool_id)}"
        return self._send(Call("PUT", path, model_of(HttpTool), body=body))

    def delete_http_tool(self, tool_id: str) -> ToolDeleted:
        path = f"/tools/http/{seg(tool_id)}"
        return self._send(Call("DELETE", path, model_of(ToolDeleted)))

    def tool_policy(self, user_uuid: str | None = None, scope: Scope | None = None) -> ToolPolicy:
        """Your rules and the global ones; admins: another user's or the global rules."""
        params = given(user_uuid=user_uuid, scope=scope)
        return self._send(Call("GET", "/tools/policy", model_of(ToolPolicy), params=params))

    def set_tool_policy(
        self,
        rules: Sequence[Mapping[str, str]],
        user_uuid: str | None = None,
        scope: Scope | None = None,
    ) -> ToolPolicy:
        """Replace the rules (`[{"tool": glob, "action": "allow" | "deny"}]`) of a scope."""
        params = given(user_uuid=user_uuid, scope=scope)
        body = {"rules": [dict(r) for r in rules]}
        call = Call("PUT", "/tools/policy", model_of(ToolPolicy), body=body, params=params)
        return self._send(call)
