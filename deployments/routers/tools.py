"""Users' agent tools over HTTP (issue 30): MCP servers (a user's own; admins' shared and stdio
ones), HTTP tools, and tool policies (a user's own rules; admins set anyone's and the global
ones). Rules and storage live in `orchestrator.tools`; registering or changing how to reach
an MCP server lists its tools at once, so the answer says whether it works (`status`).
Header and env values are secrets: never answered (`***`), logged or put in an event."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import Catalog, CurrentUser, ToolClients, Tools
from orchestrator import wire
from orchestrator.tools import HttpTool, McpServer, StoredPolicy, ToolStore
from orchestrator.toolset import AgentToolClients

router = APIRouter(tags=["tools"])

ServerId = Annotated[str, Path(max_length=64, description="MCP server id (`mcp-<n>`)")]
ToolId = Annotated[str, Path(max_length=64, description="HTTP tool id (`http-<n>`)")]
UserUuid = Annotated[
    str | None,
    Query(min_length=1, max_length=256, description="Admins: another user's policy"),
]
Scope = Annotated[
    Literal["user", "global"] | None,
    Query(description="`global`: the rules that bind every user (admins)"),
]

_NAME = "1-32 characters of a-z 0-9 _ -, no two _ in a row"


# --- bodies ---------------------------------------------------------------------------------


class McpServerChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=256, description=_NAME)
    url: str | None = Field(None, max_length=100_000, description="Streamable HTTP endpoint")
    headers: dict[str, str] | None = Field(
        None,
        description="Sent with every request; values are secrets (answered as `***`). Given:"
        " replace the stored ones (`***` keeps a stored value)",
    )
    command: str | None = Field(
        None, max_length=100_000, description="stdio (admins): one of mcp_stdio_commands"
    )
    args: list[str] | None = Field(None, description="stdio: the command's arguments")
    env: dict[str, str] | None = Field(None, description="stdio: environment (secrets)")
    shared: bool | None = Field(None, description="Admins: usable by every user")

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class McpServerBody(McpServerChange):
    name: str = Field(max_length=256, description=_NAME)


class HttpToolChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=256, description=f"{_NAME}; offered as http__<name>")
    description: str | None = Field(None, max_length=100_000)
    parameters: dict[str, Any] | None = Field(
        None, description='A JSON Schema object: {"type": "object", "properties": {...}}'
    )
    method: str | None = Field(None, max_length=16, description="GET, POST, PUT, PATCH, DELETE")
    url: str | None = Field(
        None, max_length=100_000, description="May hold {param} placeholders of parameters"
    )
    headers: dict[str, str] | None = Field(
        None, description="Values are secrets (answered as `***`); given: replace the stored"
    )

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class HttpToolBody(HttpToolChange):
    name: str = Field(max_length=256, description=f"{_NAME}; offered as http__<name>")
    description: str = Field(max_length=100_000)
    parameters: dict[str, Any] = Field(
        description='A JSON Schema object: {"type": "object", "properties": {...}}'
    )
    method: str = Field(max_length=16, description="GET, POST, PUT, PATCH, DELETE")
    url: str = Field(max_length=100_000, description="May hold {param} placeholders")


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[wire.ToolRule] = Field(description="First match wins within a scope")


def _server(server: McpServer) -> wire.McpServer:
    return wire.McpServer(**server.wire(), version=server.version)


def _http(tool: HttpTool) -> wire.HttpTool:
    return wire.HttpTool(**tool.wire())


def _policy(policy: StoredPolicy) -> wire.ToolPolicy:
    return wire.ToolPolicy(**policy.wire())


async def _listed(clients: AgentToolClients, store: ToolStore, server: McpServer) -> McpServer:
    """`server` with what listing its tools now gives (its tools, or why not). The listing's
    session is this request's alone and closed after it (`keep=False`): an API replica holds
    no stdio child or open stream for a registration or a refresh."""
    from orchestrator.tools import McpUnavailable  # with the MCP SDK: on first use

    try:
        tools = await clients.mcp.list_tools(server, keep=False)
    except McpUnavailable as exc:
        return await store.record_listing(server, error=str(exc))
    return await store.record_listing(server, tools)


# --- every tool -----------------------------------------------------------------------------


@router.get("/tools", response_model=wire.ToolList, response_model_exclude_none=True)
async def list_tools(tool_catalog: Catalog, caller: CurrentUser) -> wire.ToolList:
    """Every tool the caller's agents can use, by the name a step's `tools` gives
    (`mcp__<server>` there stands for all of one server's). The policy is not applied here:
    GET /tools/policy says what it refuses."""
    return wire.ToolList(
        tools=[wire.ToolInfo(**t) for t in await tool_catalog.listing(caller.user_uuid)]
    )


# --- MCP servers ----------------------------------------------------------------------------

_EXCLUDE_NONE: dict[str, Any] = {"response_model_exclude_none": True}


@router.post(
    "/mcp/servers",
    response_model=wire.McpServer,
    status_code=201,
    responses={
        400: {"description": "a bad field (named), a refused URL, or mcp_max_servers_per_user"},
        403: {"description": "shared or stdio servers are admin only"},
        409: {"description": "the name is taken (yours, or a shared server's)"},
    },
    **_EXCLUDE_NONE,
)
async def create_mcp_server(
    body: McpServerBody, tool_store: Tools, tool_clients: ToolClients, caller: CurrentUser
) -> wire.McpServer:
    """Register an MCP server: `url` (streamable HTTP, `headers`) or, for admins, `command`
    (stdio, `args`, `env`); admins may make it `shared`. Its tools are listed at once: a
    server that cannot be reached is registered with status `error` and the reason."""
    server = await tool_store.create_mcp_server(caller, body.given())
    return _server(await _listed(tool_clients, tool_store, server))


@router.get("/mcp/servers", response_model=wire.McpServerList, **_EXCLUDE_NONE)
async def list_mcp_servers(tool_store: Tools, caller: CurrentUser) -> wire.McpServerList:
    servers = await tool_store.list_mcp_servers(caller)
    return wire.McpServerList(servers=[_server(s) for s in servers])


@router.get("/mcp/servers/{server_id}", response_model=wire.McpServer, **_EXCLUDE_NONE)
async def get_mcp_server(
    server_id: ServerId, tool_store: Tools, caller: CurrentUser
) -> wire.McpServer:
    return _server(await tool_store.get_mcp_server(caller, server_id))


@router.put("/mcp/servers/{server_id}", response_model=wire.McpServer, **_EXCLUDE_NONE)
async def update_mcp_server(
    body: McpServerChange,
    server_id: ServerId,
    tool_store: Tools,
    tool_clients: ToolClients,
    caller: CurrentUser,
) -> wire.McpServer:
    """Change a server (shared ones: admins). A new url, headers, command, args or env
    bumps its `version` and lists its tools again."""
    server, reconnect = await tool_store.update_mcp_server(caller, server_id, body.given())
    if reconnect:  # (a pooled session of the older version is retired on its next use)
        server = await _listed(tool_clients, tool_store, server)
    return _server(server)


@router.delete("/mcp/servers/{server_id}", response_model=wire.ToolDeleted)
async def delete_mcp_server(
    server_id: ServerId, tool_store: Tools, tool_clients: ToolClients, caller: CurrentUser
) -> wire.ToolDeleted:
    server = await tool_store.delete_mcp_server(caller, server_id)
    tool_clients.mcp.forget(server.id)  # (the workers' sessions close when idle: IDLE_CLOSE_S)
    return wire.ToolDeleted(deleted=server.id)


@router.post("/mcp/servers/{server_id}/refresh", response_model=wire.McpServer, **_EXCLUDE_NONE)
async def refresh_mcp_server(
    server_id: ServerId, tool_store: Tools, tool_clients: ToolClients, caller: CurrentUser
) -> wire.McpServer:
    """List the server's tools again (shared ones: admins)."""
    server = await tool_store.editable_mcp_server(caller, server_id)
    return _server(await _listed(tool_clients, tool_store, server))


# --- HTTP tools -----------------------------------------------------------------------------


@router.post(
    "/tools/http",
    response_model=wire.HttpTool,
    status_code=201,
    responses={
        400: {"description": "a bad field (named), a refused URL, or http_tools_max_per_user"},
        409: {"description": "you have an HTTP tool of that name"},
    },
)
async def create_http_tool(
    body: HttpToolBody, tool_store: Tools, caller: CurrentUser
) -> wire.HttpTool:
    """Define `http__<name>`: a request agents make with the arguments they give (`{param}`
    placeholders of the URL, the rest in the query or a JSON body)."""
    return _http(await tool_store.create_http_tool(caller, body.given()))


@router.get("/tools/http", response_model=wire.HttpToolList)
async def list_http_tools(tool_store: Tools, caller: CurrentUser) -> wire.HttpToolList:
    return wire.HttpToolList(tools=[_http(t) for t in await tool_store.list_http_tools(caller)])


@router.get("/tools/http/{tool_id}", response_model=wire.HttpTool)
async def get_http_tool(tool_id: ToolId, tool_store: Tools, caller: CurrentUser) -> wire.HttpTool:
    return _http(await tool_store.get_http_tool(caller, tool_id))


@router.put("/tools/http/{tool_id}", response_model=wire.HttpTool)
async def update_http_tool(
    body: HttpToolChange, tool_id: ToolId, tool_store: Tools, caller: CurrentUser
) -> wire.HttpTool:
    return _http(await tool_store.update_http_tool(caller, tool_id, body.given()))


@router.delete("/tools/http/{tool_id}", response_model=wire.ToolDeleted)
async def delete_http_tool(
    tool_id: ToolId, tool_store: Tools, caller: CurrentUser
) -> wire.ToolDeleted:
    await tool_store.delete_http_tool(caller, tool_id)
    return wire.ToolDeleted(deleted=tool_id)


# --- policies -------------------------------------------------------------------------------


@router.get("/tools/policy", response_model=wire.ToolPolicy)
async def get_tool_policy(
    tool_store: Tools, caller: CurrentUser, user_uuid: UserUuid = None, scope: Scope = None
) -> wire.ToolPolicy:
    """Your rules and the global ones that bind you; admins: anyone's (`user_uuid`) or the
    global rules (`scope=global`)."""
    stored = await tool_store.get_policy(caller, scope=scope, user_uuid=user_uuid)
    return _policy(stored)


@router.put("/tools/policy", response_model=wire.ToolPolicy)
async def set_tool_policy(
    body: PolicyBody,
    tool_store: Tools,
    caller: CurrentUser,
    user_uuid: UserUuid = None,
    scope: Scope = None,
) -> wire.ToolPolicy:
    """Replace the rules of a scope (as GET names it). Each new `allow` rule of a user is an
    `audit.permission_grant` event of theirs."""
    rules = [r.model_dump() for r in body.rules]
    stored = await tool_store.set_policy(caller, rules, scope=scope, user_uuid=user_uuid)
    return _policy(stored)
