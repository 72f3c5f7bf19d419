"""The tools a task is offered and a user can name: the service's own (built-in, memory,
workspace, marketplace) and the user's MCP servers' and HTTP tools, under their policy.

One read per task (`ToolStore.for_user`: own and shared servers with their listed tools,
HTTP tools, the global and the user's rules in one round trip) builds the task's registry;
an MCP tool is offered from the list its server gave when registered or refreshed (a server
down at call time is an error result, and comes back by itself once it is up).

Names: an MCP tool is `mcp__<server>__<tool>` (Claude Code's convention), an HTTP tool
`http__<name>`. Providers take `[A-Za-z0-9_-]{1,64}` as a function name: an MCP tool name
outside that is offered with the other characters as `_` and cut at 64 (the call still goes
to the server under its own name)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from orchestrator.agents import TaskTools, Tool, ToolContext, ToolOutcome, ToolRegistry
from orchestrator.tools._model import HTTP_PREFIX, MCP_PREFIX, HttpTool, McpServer, McpToolInfo

if TYPE_CHECKING:
    import httpx

    from orchestrator.config import Settings
    from orchestrator.tools._mcp import McpPool
    from orchestrator.tools._store import ToolStore, UserTools

_FUNCTION_NAME = re.compile(r"[^A-Za-z0-9_-]")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def offered_name(server: str, tool: str) -> str:
    return _FUNCTION_NAME.sub("_", f"{MCP_PREFIX}{server}__{tool}")[:64]


class ToolCatalog:
    """`for_task` for the agent runner (a `ToolSource`), `listing` and `unknown` for the
    API (GET /tools, the names of a step's `tools` checked when a workflow is created)."""

    def __init__(
        self,
        static: ToolRegistry,
        store: ToolStore,
        settings: Settings,
        *,
        mcp: Callable[[], McpPool] | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._static = static
        self._store = store
        self._settings = settings
        self._mcp = mcp
        self._http = http

    async def for_task(self, user_uuid: str) -> TaskTools:
        user = await self._store.for_user(user_uuid)
        return TaskTools(self._static.extended(self._own(user)), user.policy)

    async def listing(self, user_uuid: str) -> list[dict[str, Any]]:
        """Every tool the user's agents can use, by name (GET /tools): what their policy
        denies is left out, as it is not offered to their agents; what it asks a person's
        approval for is listed with `approval: true` (it runs once approved)."""
        user = await self._store.for_user(user_uuid)
        registry = self._static.extended(self._own(user))
        listed: list[dict[str, Any]] = []
        for t in (registry.get(n) for n in registry.names()):
            if t is None:
                continue
            decision = user.policy.decide(t.name)
            if not decision.allowed:
                continue
            listed.append(
                {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "source": t.source,
                    **({"origin": t.origin} if t.origin else {}),
                    **({"approval": True} if decision.needs_approval else {}),
                }
            )
        return listed

    async def unknown(self, names: Iterable[str], user_uuid: str) -> list[str]:
        """The names that name no tool of the user (a tool, or `mcp__<server>` for all of a
        server's), in the order given."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return []
        if all(self._static.get(n) is not None for n in wanted):
            return []  # no need to read the user's own tools
        user = await self._store.for_user(user_uuid)
        registry = self._static.extended(self._own(user))
        servers = {f"{MCP_PREFIX}{s.name}" for s in user.mcp}
        return [n for n in wanted if registry.get(n) is None and n not in servers]

    def _own(self, user: UserTools) -> list[Tool]:
        tools: dict[str, Tool] = {}
        for server in user.mcp:
            for info in server.tools:
                tool = self._mcp_tool(server, info)
                tools.setdefault(tool.name, tool)
        for http_tool in user.http:
            tools.setdefault(http_tool.tool_name, self._http_tool(http_tool))
        return list(tools.values())

    def _mcp_tool(self, server: McpServer, info: McpToolInfo) -> Tool:
        pool = self._mcp

        async def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutcome:
            if pool is None:
                return ToolOutcome("error: MCP tools cannot be called here", is_error=True)
            return await pool().call(server, info.name, arguments)

        return Tool(
            offered_name(server.name, info.name),
            info.description or f"{info.name} (MCP server {server.name})",
            info.input_schema or _EMPTY_SCHEMA,
            call,
            source="mcp",
            origin=server.id,
        )

    def _http_tool(self, tool: HttpTool) -> Tool:
        from orchestrator.tools._http import call_http_tool

        client = self._http
        limit = self._settings.tool_result_max_bytes

        async def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutcome:
            if client is None:
                return ToolOutcome("error: HTTP tools cannot be called here", is_error=True)
            return await call_http_tool(tool, arguments, client, limit)

        return Tool(
            f"{HTTP_PREFIX}{tool.name}",
            tool.description,
            tool.parameters,
            call,
            source="http",
            origin=tool.id,
        )
