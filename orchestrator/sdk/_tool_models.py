"""Typed results of the agent-tools endpoints (MCP servers, HTTP tools, tool policies, the
tools a user's agents can use), as a client sees them.

The same kind of models as _models.py (see there: checked against the app's OpenAPI document
by tests/unit/test_sdk_openapi.py, unknown fields kept), in their own module to keep
_models.py short; `orchestrator.sdk` exports them with the others.
"""

from __future__ import annotations

from typing import Any, Literal

from orchestrator.sdk._models import ApiModel

__all__ = [
    "HttpTool",
    "HttpToolList",
    "McpServer",
    "McpServerList",
    "McpTool",
    "ToolDeleted",
    "ToolInfo",
    "ToolList",
    "ToolPolicy",
    "ToolRule",
]


class McpTool(ApiModel):
    name: str
    description: str
    input_schema: dict[str, Any]


class McpServer(ApiModel):
    """A registered MCP server; header and env values are shown as `***`."""

    id: str
    name: str
    transport: Literal["streamable_http", "stdio"]
    shared: bool
    owner: str
    status: Literal["ready", "error"]
    error: str | None = None
    tools: list[McpTool]
    version: int
    url: str | None = None
    headers: dict[str, str] | None = None
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    created_at: int
    updated_at: int


class McpServerList(ApiModel):
    servers: list[McpServer]


class ToolDeleted(ApiModel):
    ok: bool = True
    deleted: str


class HttpTool(ApiModel):
    """A user's HTTP tool (`tool` is its name for agents: `http__<name>`); header values are
    shown as `***`."""

    id: str
    name: str
    tool: str
    description: str
    parameters: dict[str, Any]
    method: str
    url: str
    headers: dict[str, str]
    created_at: int
    updated_at: int


class HttpToolList(ApiModel):
    tools: list[HttpTool]


class ToolRule(ApiModel):
    tool: str
    action: Literal["allow", "deny"]


class ToolPolicy(ApiModel):
    scope: Literal["user", "global"]
    user_uuid: str | None
    rules: list[ToolRule]
    global_rules: list[ToolRule]
    updated_at: int | None = None
    updated_by: str | None = None


class ToolInfo(ApiModel):
    """A tool a user's agents can use; `source`: builtin, memory, workspace, mcp, http or
    marketplace."""

    name: str
    description: str
    parameters: dict[str, Any]
    source: str
    origin: str | None = None


class ToolList(ApiModel):
    tools: list[ToolInfo]
