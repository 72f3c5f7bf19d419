"""Users' agent tools (issue 30): MCP servers, HTTP tools, tool policies and the tools a
user's agents can use. Header and env values are secrets: always answered as `***`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from orchestrator.wire._base import ApiModel

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

    id: str = Field(description="`mcp-<n>`")
    name: str
    transport: Literal["streamable_http", "stdio"]
    shared: bool
    owner: str = Field(description="The registering user's user_uuid")
    status: Literal["ready", "error"] = Field(description="Whether listing its tools worked")
    error: str | None = Field(None, description="Why listing its tools failed")
    tools: list[McpTool]
    version: int = Field(description="Grows with each change of how to reach it")
    url: str | None = None
    headers: dict[str, str] | None = Field(None, description="Values as `***`")
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = Field(None, description="Values as `***`")
    created_at: int
    updated_at: int


class McpServerList(ApiModel):
    servers: list[McpServer] = Field(description="The caller's own, then the shared ones")


class ToolDeleted(ApiModel):
    ok: bool = True
    deleted: str


class HttpTool(ApiModel):
    """A user's HTTP tool (`tool` is its name for agents: `http__<name>`); header values are
    shown as `***`."""

    id: str = Field(description="`http-<n>`")
    name: str
    tool: str = Field(description="The name agents call it by: http__<name>")
    description: str
    parameters: dict[str, Any]
    method: str
    url: str
    headers: dict[str, str] = Field(description="Values as `***`")
    created_at: int
    updated_at: int


class HttpToolList(ApiModel):
    tools: list[HttpTool]


class ToolRule(ApiModel):
    """One rule of a tool policy, as PUT /tools/policy takes it and GET answers it."""

    model_config = ConfigDict(extra="forbid")

    tool: str = Field(max_length=256, description="A tool name or a glob (`mcp__github__*`)")
    action: Literal["allow", "deny", "ask"] = Field(
        description="`ask`: a call waits for a person's approval (an intervention)"
    )


class ToolPolicy(ApiModel):
    scope: Literal["user", "global"]
    user_uuid: str | None = Field(description="Whose rules (null: the global ones)")
    rules: list[ToolRule]
    global_rules: list[ToolRule] = Field(
        description="The global rules: a global deny wins over any user rule"
    )
    updated_at: int | None = None
    updated_by: str | None = None


class ToolInfo(ApiModel):
    """A tool a user's agents can use."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(description="The JSON Schema of its arguments")
    source: Literal["builtin", "memory", "workspace", "mcp", "http", "marketplace"]
    origin: str | None = Field(None, description="The MCP server's or HTTP tool's id")
    approval: bool | None = Field(
        None, description="True: the policy asks a person's approval before each call"
    )


class ToolList(ApiModel):
    tools: list[ToolInfo]
