"""The agent runtime: tasks, the agent loop (LLM turns + tools), tools, dispatchers.

What a task is (`_task`) loads with the package; the loop and the tools (which load the
provider clients) load on first use, so the actors that only dispatch tasks (workflow
shards, the scheduler, channel hubs) start without them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports
from orchestrator.agents._task import (
    COORDINATOR,
    MODES,
    AgentTask,
    TaskDispatcher,
    TaskResult,
    TaskStatus,
    TeamSeat,
    created_event,
    tools_refused,
)

if TYPE_CHECKING:
    from orchestrator.agents._emitter import Emitter
    from orchestrator.agents._runner import AgentRunner, LocalDispatcher, TaskFailed
    from orchestrator.agents._tools import (
        BUILTIN_TOOLS,
        FixedTools,
        Gate,
        TaskTools,
        Tool,
        ToolContext,
        ToolFailed,
        ToolOutcome,
        ToolRegistry,
        ToolSource,
        cut_utf8,
        default_registry,
        evaluate_arithmetic,
    )

_LAZY = {
    "AgentRunner": "_runner",
    "Emitter": "_emitter",
    "LocalDispatcher": "_runner",
    "TaskFailed": "_runner",
    "BUILTIN_TOOLS": "_tools",
    "FixedTools": "_tools",
    "Gate": "_tools",
    "TaskTools": "_tools",
    "ToolOutcome": "_tools",
    "ToolSource": "_tools",
    "Tool": "_tools",
    "ToolContext": "_tools",
    "ToolFailed": "_tools",
    "ToolRegistry": "_tools",
    "cut_utf8": "_tools",
    "default_registry": "_tools",
    "evaluate_arithmetic": "_tools",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "BUILTIN_TOOLS",
    "COORDINATOR",
    "MODES",
    "AgentRunner",
    "AgentTask",
    "Emitter",
    "FixedTools",
    "Gate",
    "LocalDispatcher",
    "TaskDispatcher",
    "TaskFailed",
    "TaskResult",
    "TaskStatus",
    "TaskTools",
    "TeamSeat",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "ToolOutcome",
    "ToolRegistry",
    "ToolSource",
    "created_event",
    "cut_utf8",
    "default_registry",
    "evaluate_arithmetic",
    "tools_refused",
]
