"""Every tool an agent can be offered, from each part that has some (built-ins, memory,
workspace, marketplace)."""

from __future__ import annotations

from orchestrator.agents import ToolRegistry, default_registry
from orchestrator.marketplace import MARKETPLACE_TOOLS
from orchestrator.memory import MEMORY_TOOLS
from orchestrator.workspace import WORKSPACE_TOOLS


def service_tools() -> ToolRegistry:
    tools = default_registry()
    for tool in (*MEMORY_TOOLS, *WORKSPACE_TOOLS, *MARKETPLACE_TOOLS):
        tools.register(tool)
    return tools
