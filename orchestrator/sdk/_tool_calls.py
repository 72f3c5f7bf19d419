"""The agent-tools endpoints of the API (MCP servers, HTTP tools, tool policies, the tools a
user's agents can use), each described once as a `Call`, as _calls.py describes the others;
the mixins of _tools.py send them. Path segments are escaped with _calls.py's `_seg`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from orchestrator.sdk._base import Call, model_of, query
from orchestrator.sdk._calls import _seg
from orchestrator.sdk._tool_models import (
    HttpTool,
    HttpToolList,
    McpServer,
    McpServerList,
    ToolDeleted,
    ToolList,
    ToolPolicy,
)


def tools() -> Call[ToolList]:
    return Call("GET", "/tools", model_of(ToolList))


def mcp_servers() -> Call[McpServerList]:
    return Call("GET", "/mcp/servers", model_of(McpServerList))


def create_mcp_server(
    name: str,
    url: str | None,
    headers: Mapping[str, str] | None,
    command: str | None,
    args: Sequence[str] | None,
    env: Mapping[str, str] | None,
    shared: bool,
) -> Call[McpServer]:
    body = query(
        name=name,
        url=url,
        headers=None if headers is None else dict(headers),
        command=command,
        args=None if args is None else list(args),
        env=None if env is None else dict(env),
        shared=shared or None,
    )
    return Call("POST", "/mcp/servers", model_of(McpServer), body=body)


def mcp_server(server_id: str) -> Call[McpServer]:
    return Call("GET", f"/mcp/servers/{_seg(server_id)}", model_of(McpServer))


def update_mcp_server(
    server_id: str,
    name: str | None,
    url: str | None,
    headers: Mapping[str, str] | None,
    command: str | None,
    args: Sequence[str] | None,
    env: Mapping[str, str] | None,
    shared: bool | None,
) -> Call[McpServer]:
    body = query(
        name=name,
        url=url,
        headers=None if headers is None else dict(headers),
        command=command,
        args=None if args is None else list(args),
        env=None if env is None else dict(env),
        shared=shared,
    )
    return Call("PUT", f"/mcp/servers/{_seg(server_id)}", model_of(McpServer), body=body)


def delete_mcp_server(server_id: str) -> Call[ToolDeleted]:
    return Call("DELETE", f"/mcp/servers/{_seg(server_id)}", model_of(ToolDeleted))


def refresh_mcp_server(server_id: str) -> Call[McpServer]:
    return Call("POST", f"/mcp/servers/{_seg(server_id)}/refresh", model_of(McpServer))


def http_tools() -> Call[HttpToolList]:
    return Call("GET", "/tools/http", model_of(HttpToolList))


def create_http_tool(
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    method: str,
    url: str,
    headers: Mapping[str, str] | None,
) -> Call[HttpTool]:
    body = query(
        name=name,
        description=description,
        parameters=dict(parameters),
        method=method,
        url=url,
        headers=None if headers is None else dict(headers),
    )
    return Call("POST", "/tools/http", model_of(HttpTool), body=body)


def http_tool(tool_id: str) -> Call[HttpTool]:
    return Call("GET", f"/tools/http/{_seg(tool_id)}", model_of(HttpTool))


def update_http_tool(
    tool_id: str,
    name: str | None,
    description: str | None,
    parameters: Mapping[str, Any] | None,
    method: str | None,
    url: str | None,
    headers: Mapping[str, str] | None,
) -> Call[HttpTool]:
    body = query(
        name=name,
        description=description,
        parameters=None if parameters is None else dict(parameters),
        method=method,
        url=url,
        headers=None if headers is None else dict(headers),
    )
    return Call("PUT", f"/tools/http/{_seg(tool_id)}", model_of(HttpTool), body=body)


def delete_http_tool(tool_id: str) -> Call[ToolDeleted]:
    return Call("DELETE", f"/tools/http/{_seg(tool_id)}", model_of(ToolDeleted))


def tool_policy(user_uuid: str | None, scope: Literal["user", "global"] | None) -> Call[ToolPolicy]:
    params = query(user_uuid=user_uuid, scope=scope)
    return Call("GET", "/tools/policy", model_of(ToolPolicy), params=params)


def set_tool_policy(
    rules: Sequence[Mapping[str, str]],
    user_uuid: str | None,
    scope: Literal["user", "global"] | None,
) -> Call[ToolPolicy]:
    params = query(user_uuid=user_uuid, scope=scope)
    body = {"rules": [dict(r) for r in rules]}
    return Call("PUT", "/tools/policy", model_of(ToolPolicy), body=body, params=params)
