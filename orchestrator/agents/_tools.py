"""Tools an agent can call. Each is a name, a description, a JSON schema of its arguments
and an async handler bound to the task's user (`ToolContext.task.user_uuid`). The workspace
and memory parts register theirs; two harmless ones are built in."""

from __future__ import annotations

import ast
import datetime as dt
import math
import operator
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.agents._task import AgentTask
from orchestrator.config import Settings
from orchestrator.providers import ToolDef


class ToolFailed(Exception):
    """A tool's own failure: reported to the model as an error result, not a crash."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    task: AgentTask
    settings: Settings
    services: dict[str, Any]  # what tools need from the host: "pool", "events", ...


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A handler may answer this instead of a string: a result the model sees as an error
    (an MCP tool's `isError`, an HTTP tool's non-2xx answer) without the call failing."""

    text: str
    is_error: bool = False


Handler = Callable[[ToolContext, dict[str, Any]], Awaitable["str | ToolOutcome"]]


# `cut_utf8(..., omitted=REST_UNKNOWN)`: the reader stopped without knowing how much was left.
REST_UNKNOWN = -1


def cut_utf8(text: str, max_bytes: int, *, omitted: int | None = None) -> str:
    """`text` in at most `max_bytes` of UTF-8, whole characters, the note of a cut included:
    what the model is given of one tool result (tool_result_max_bytes), by whichever part
    made it (an MCP call, an HTTP tool, the runner), so a result is cut once.

    `omitted`: how many bytes of the answer never reached `text` (a reader that stopped
    early), or REST_UNKNOWN; None when `text` is the whole answer. The note says how many
    bytes were cut when that is known, else that the answer was longer than the limit."""
    if not omitted:  # None or 0: `text` is all there is
        if len(text) * 4 <= max_bytes:  # cheap common case: it fits whatever its characters
            return text
        raw = text.encode()
        if len(raw) <= max_bytes:
            return text
    else:
        raw = text.encode()
    rest = None if omitted is not None and omitted < 0 else (omitted or 0)
    # Room for the note at its longest (the count if nothing of `text` were kept).
    room = max_bytes - len(_cut_note(None if rest is None else len(raw) + rest).encode())
    if room < 0:  # a limit smaller than the note: what fits of the note (ASCII)
        return _cut_note(None).lstrip("\n")[: max(max_bytes, 0)]
    kept = raw[:room].decode(errors="ignore")  # only a character split at the end is lost
    cut = None if rest is None else len(raw) - len(kept.encode()) + rest
    return kept + _cut_note(cut)


def _cut_note(cut: int | None) -> str:
    if cut is None:
        return "\n[... the answer was longer than tool_result_max_bytes: the rest was cut]"
    return f"\n[... {cut} more bytes cut (tool_result_max_bytes)]"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    # Where it comes from (GET /tools, audit.tool_executed): builtin, memory, workspace,
    # marketplace, or a user's mcp / http tool with `origin` the server's or tool's id.
    source: str = "builtin"
    origin: str | None = None

    def definition(self) -> ToolDef:
        return ToolDef(self.name, self.description, self.parameters)


GROUP_PREFIX = "mcp__"  # `mcp__<server>` in a step's tools: all of that server's


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def extended(self, tools: Iterable[Tool]) -> ToolRegistry:
        """A copy with `tools` added (one task's own: its user's MCP and HTTP tools)."""
        out = ToolRegistry()
        out._tools = dict(self._tools)
        for tool in tools:
            out.register(tool)
        return out

    def offered(self, allowed: tuple[str, ...] | None) -> list[Tool]:
        """The tools a task may call: all of them, or those of its `tools` list, where
        `mcp__<server>` stands for all of one MCP server's tools."""
        if allowed is None:
            return [self._tools[n] for n in self.names()]
        chosen: dict[str, Tool] = {}
        for name in allowed:
            if name in self._tools:
                chosen.setdefault(name, self._tools[name])
            elif name.startswith(GROUP_PREFIX) and "__" not in name[len(GROUP_PREFIX) :]:
                prefix = f"{name}__"  # mcp__<server>: every tool of that server
                for key in self.names():
                    if key.startswith(prefix):
                        chosen.setdefault(key, self._tools[key])
        return list(chosen.values())


class Verdict(Protocol):
    @property
    def allowed(self) -> bool: ...

    @property
    def needs_approval(self) -> bool: ...

    @property
    def scope(self) -> str | None: ...

    @property
    def reason(self) -> str: ...


class Gate(Protocol):
    """A tool policy: whether a call of `tool` may run (orchestrator/tools/_policy.py)."""

    def decide(self, tool: str) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class TaskTools:
    """What one task may use: the tools, and the policy every call passes first."""

    registry: ToolRegistry
    gate: Gate | None = None


class ToolSource(Protocol):
    """Where a runner gets a task's tools: a fixed registry, or (orchestrator/tools) the
    service's tools plus the task user's own MCP and HTTP tools under their policy."""

    async def for_task(self, user_uuid: str) -> TaskTools: ...


class TeamRoom(Protocol):
    """A task's place in its agent team (issue 33, orchestrator/teams): the team tools it
    gets beside its step's, and what its system prompt says about them."""

    @property
    def note(self) -> str: ...

    def tools(self) -> list[Tool]: ...


class FixedTools:
    """The same tools for every task, no policy (tests, hosts without a tool store)."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._tools = TaskTools(registry)

    async def for_task(self, user_uuid: str) -> TaskTools:
        return self._tools


# --- built-in tools ---------------------------------------------------------------------------


async def _current_time(ctx: ToolContext, args: dict[str, Any]) -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "log": math.log,
}


# Every integer the calculator makes, intermediate ones included, stays under this many bits
# (about 3,000 digits): the work of each step is bounded before it is done, so no expression
# can hold the event loop that every task on the worker shares.
MAX_INT_BITS = 10_000


def _bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse an operation whose integer result would be too large, before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float arithmetic is bounded by the float format (overflow raises)
    if isinstance(op, ast.Pow):
        if right < 0:
            return  # a float
        if abs(left) > 1 and _bits(left) * right > MAX_INT_BITS:
            raise ToolFailed(f"result too large (more than {MAX_INT_BITS} bits)")
    elif isinstance(op, ast.Mult) and _bits(left) + _bits(right) > MAX_INT_BITS:
        raise ToolFailed(f"result too large (more than {MAX_INT_BITS} bits)")


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolFailed(f"result too large (more than {MAX_INT_BITS} bits)")
    return value


def evaluate_arithmetic(expression: str) -> float | int:
    """Arithmetic over numbers, + - * / // % **, and a few functions; nothing else
    (walks the syntax tree: no eval)."""
    if len(expression) > 500:
        raise ToolFailed("expression too long (500 characters at most)")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ToolFailed(f"not an arithmetic expression: {exc.msg}") from exc

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            _check_size(node.op, left, right)
            return _bounded(_BINARY[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _bounded(_UNARY[type(node.op)](walk(node.operand)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            args = [walk(a) for a in node.args]
            if node.func.id == "round" and len(args) == 2 and abs(args[1]) > MAX_INT_BITS:
                raise ToolFailed("round: too many digits")
            return _bounded(_FUNCS[node.func.id](*args))
        raise ToolFailed(f"unsupported syntax: {ast.dump(node)[:60]}")

    try:
        value = walk(tree)
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolFailed(f"cannot evaluate: {exc}") from exc
    if not isinstance(value, int | float):
        raise ToolFailed("the result is not a number")
    return value


async def _calculate(ctx: ToolContext, args: dict[str, Any]) -> str:
    expression = args.get("expression")
    if not isinstance(expression, str):
        raise ToolFailed("'expression' (a string) is required")
    return str(evaluate_arithmetic(expression))


BUILTIN_TOOLS: tuple[Tool, ...] = (
    Tool(
        "current_time",
        "The current date and time (UTC, ISO 8601).",
        {"type": "object", "properties": {}},
        _current_time,
    ),
    Tool(
        "calculate",
        "Evaluate an arithmetic expression: numbers, + - * / // % **, sqrt, abs, round, "
        "min, max, log.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (2+3)*4"}},
            "required": ["expression"],
        },
        _calculate,
    ),
)


def default_registry() -> ToolRegistry:
    return ToolRegistry(BUILTIN_TOOLS)
