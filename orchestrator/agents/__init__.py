"""The agent runtime: tasks, the agent loop (LLM turns + tools), tools, dispatchers."""

from orchestrator.agents._runner import (
    AgentRunner,
    Emitter,
    LocalDispatcher,
    TaskFailed,
    created_event,
)
from orchestrator.agents._task import MODES, AgentTask, TaskDispatcher, TaskResult, TaskStatus
from orchestrator.agents._tools import (
    BUILTIN_TOOLS,
    Tool,
    ToolContext,
    ToolFailed,
    ToolRegistry,
    default_registry,
    evaluate_arithmetic,
)

__all__ = [
    "BUILTIN_TOOLS",
    "MODES",
    "AgentRunner",
    "AgentTask",
    "Emitter",
    "LocalDispatcher",
    "TaskDispatcher",
    "TaskFailed",
    "TaskResult",
    "TaskStatus",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "ToolRegistry",
    "created_event",
    "default_registry",
    "evaluate_arithmetic",
]
