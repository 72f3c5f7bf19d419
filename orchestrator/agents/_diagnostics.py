"""`agent.diagnostic`: the non-fatal anomalies of an agent loop, as event data.

The loop goes on after each of them (the task does not fail for it), but an operator looking
at a task that answered oddly needs to know that the model's arguments were not JSON, that it
asked for a tool that does not exist, that its answer stopped at the token limit, or that
older tool results were cut to fit the context. The data says which (`kind`) and a short
`detail`: sizes and names, never the arguments themselves (they may hold secrets).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["DiagnosticKind", "diagnostic", "malformed_arguments"]

DiagnosticKind = Literal[
    "malformed_arguments", "unknown_tool", "output_truncated", "context_trimmed"
]

# The provider adapters keep arguments that are not a JSON object under these single keys
# (orchestrator/providers/_openai_format/upstream.py `_args`): the text that did not parse,
# or a JSON value that is not an object.
_UNPARSED = ({"_raw"}, {"_value"})
_NAME_MAX = 128


def malformed_arguments(arguments: Any) -> str | None:
    """Why a tool call's arguments are not a JSON object, or None when they are one."""
    if not isinstance(arguments, dict):
        return f"the arguments are a {type(arguments).__name__}, not a JSON object"
    if set(arguments) not in _UNPARSED:
        return None
    raw = next(iter(arguments.values()))
    if isinstance(raw, str):
        return f"the arguments are not valid JSON ({len(raw)} characters)"
    return f"the arguments are a JSON {type(raw).__name__}, not an object"


def diagnostic(
    kind: DiagnosticKind,
    detail: str,
    turn: int,
    *,
    tool: str | None = None,
    level: Literal["info", "warning"] = "warning",
) -> dict[str, Any]:
    """The `data` of an agent.diagnostic (the task's id is added by the emitter)."""
    data: dict[str, Any] = {"kind": kind, "detail": detail, "level": level, "turn": turn}
    if tool is not None:
        data["tool"] = tool[:_NAME_MAX]
    return data
