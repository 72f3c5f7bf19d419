"""Every tool an agent can be offered, from each part that has some (built-ins, memory,
workspace, marketplace), and what a process needs to call its users' own (MCP servers, HTTP
tools)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.agents import ToolRegistry, default_registry
from orchestrator.marketplace import MARKETPLACE_TOOLS
from orchestrator.memory import MEMORY_TOOLS
from orchestrator.workspace import WORKSPACE_TOOLS

if TYPE_CHECKING:
    import asyncpg

    from orchestrator.config import Settings
    from orchestrator.tools import McpPool, ToolCatalog, ToolStore


def service_tools() -> ToolRegistry:
    tools = default_registry()
    for tool in (*MEMORY_TOOLS, *WORKSPACE_TOOLS, *MARKETPLACE_TOOLS):
        tools.register(tool)
    return tools


class AgentToolClients:
    """What calls users' tools in one process (an AgentWorker, or an API replica): one MCP
    connection pool (and its stdio children), made on first use (the MCP SDK costs about
    half a second of import, which a process that never meets an MCP server does not pay),
    and one egress-guarded HTTP client; closed with the process."""

    def __init__(self, settings: Settings) -> None:
        from orchestrator.tools import http_tools_client

        self.settings = settings
        self.http = http_tools_client(settings)
        self._mcp: McpPool | None = None

    @property
    def mcp(self) -> McpPool:
        if self._mcp is None:
            from orchestrator.tools import McpPool

            self._mcp = McpPool(self.settings)
        return self._mcp

    def catalog(self, pool: asyncpg.Pool, store: ToolStore | None = None) -> ToolCatalog:
        """The tools of this process's tasks: the service's and each task user's."""
        from orchestrator.secret_box import configured_box
        from orchestrator.tools import ToolCatalog, ToolStore

        store = store or ToolStore(pool, configured_box(self.settings))
        return ToolCatalog(
            service_tools(), store, self.settings, mcp=lambda: self.mcp, http=self.http
        )

    async def aclose(self) -> None:
        if self._mcp is not None:
            await self._mcp.aclose()
        await self.http.aclose()
