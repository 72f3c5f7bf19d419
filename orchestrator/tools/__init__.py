"""Tools agents reach outside the service: MCP servers, users' HTTP tools, tool policies,
and the catalog that turns them (with the service's own tools) into what a task is offered.

The MCP client (`McpPool`, `McpUnavailable`) loads with its SDK on first use: the SDK costs
about a second of import, which a process that never calls an MCP server does not pay."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports
from orchestrator.tools._catalog import ToolCatalog, offered_name
from orchestrator.tools._http import call_http_tool, http_tools_client, validate_http_tool
from orchestrator.tools._model import (
    HTTP_PREFIX,
    MCP_PREFIX,
    SOURCES,
    Decision,
    HttpTool,
    McpServer,
    McpToolInfo,
    Rule,
    ToolSource,
    mcp_tool_name,
)
from orchestrator.tools._policy import Policy, parse_rules
from orchestrator.tools._store import StoredPolicy, ToolLimits, ToolStore, UserTools

if TYPE_CHECKING:
    from orchestrator.tools._mcp import McpPool, McpUnavailable

_LAZY = {"McpPool": "_mcp", "McpUnavailable": "_mcp"}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "HTTP_PREFIX",
    "MCP_PREFIX",
    "SOURCES",
    "Decision",
    "HttpTool",
    "McpPool",
    "McpServer",
    "McpToolInfo",
    "McpUnavailable",
    "Policy",
    "Rule",
    "StoredPolicy",
    "ToolCatalog",
    "ToolLimits",
    "ToolSource",
    "ToolStore",
    "UserTools",
    "call_http_tool",
    "http_tools_client",
    "mcp_tool_name",
    "offered_name",
    "parse_rules",
    "validate_http_tool",
]
