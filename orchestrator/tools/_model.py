"""What the tools agents reach outside the service are made of: MCP servers, users' HTTP
tools, tool policies, and what a call of one returns. Plain values; the store
(`_store.py`) reads and writes them, `_mcp.py` and `_http.py` call them, `_catalog.py`
turns them into the tools a task is offered."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.agents._tools import ToolOutcome
from orchestrator.observability import REDACTED

# What a call of a tool gave the model: its text, and whether it is an error result.
CallOutcome = ToolOutcome

ToolSource = Literal["builtin", "memory", "workspace", "mcp", "http", "marketplace"]
SOURCES: tuple[str, ...] = ("builtin", "memory", "workspace", "mcp", "http", "marketplace")

MCP_PREFIX = "mcp__"  # mcp__<server>__<tool>: the name Claude Code gives an MCP tool
HTTP_PREFIX = "http__"  # http__<name>
# An MCP server's or an HTTP tool's name. No `__`: it separates the parts of a tool's name, so
# a server `gh__repo` would offer `mcp__gh__repo__delete` as shared server `gh`'s `repo__delete`.
NAME_PATTERN = re.compile(r"(?!.*__)[a-z0-9_-]{1,32}")
NAME_RULE = "1-32 characters of a-z 0-9 _ -, no two _ in a row"
MCP_ID = re.compile(r"mcp-[0-9]{1,18}")
HTTP_ID = re.compile(r"http-[0-9]{1,18}")


def mcp_tool_name(server: str, tool: str) -> str:
    return f"{MCP_PREFIX}{server}__{tool}"


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool as its MCP server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


@dataclass(frozen=True, slots=True)
class McpServer:
    """A registered MCP server. `headers` and `env` hold the decrypted secret values: never
    returned, logged or put in an event (`wire()` masks them). `version` grows with every
    change of the server's connection settings: a pooled connection of an older version is
    closed and opened again."""

    id: str  # "mcp-<n>"
    owner: str  # the registering user's user_uuid (an admin's, for a shared server)
    name: str
    transport: Literal["streamable_http", "stdio"]
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    shared: bool = False
    status: Literal["ready", "error"] = "ready"
    error: str | None = None
    tools: tuple[McpToolInfo, ...] = ()
    version: int = 1
    created_at: int = 0  # Unix ms
    updated_at: int = 0

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "transport": self.transport,
            "shared": self.shared,
            "owner": self.owner,
            "status": self.status,
            "tools": [t.wire() for t in self.tools],
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.transport == "streamable_http":
            out["url"] = self.url
            out["headers"] = {k: REDACTED for k in self.headers}
        else:
            out["command"] = self.command
            out["args"] = list(self.args)
            out["env"] = {k: REDACTED for k in self.env}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class HttpTool:
    """A user's HTTP tool, offered as `http__<name>`. `headers` holds decrypted secrets."""

    id: str  # "http-<n>"
    user_uuid: str
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema object
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
    url: str  # may contain {param} placeholders
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    created_at: int = 0
    updated_at: int = 0

    @property
    def tool_name(self) -> str:
        return f"{HTTP_PREFIX}{self.name}"

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "tool": self.tool_name,
            "description": self.description,
            "parameters": self.parameters,
            "method": self.method,
            "url": self.url,
            "headers": {k: REDACTED for k in self.headers},
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


Action = Literal["allow", "deny", "ask"]
# How strict each action is: the stricter verdict of the global and the user's rules wins.
STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True, slots=True)
class Rule:
    tool: str  # a tool name or a glob (`*`, `?`, `[...]`): `mcp__github__*`
    action: Action

    def wire(self) -> dict[str, str]:
        return {"tool": self.tool, "action": self.action}


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a call may run, and which rule said so (None: no rule matched: allowed).
    `needs_approval` (an `ask` rule): the tool is offered and may run, but only once a
    person has approved the call (an intervention); `allowed` stays True for it."""

    allowed: bool
    scope: Literal["global", "user"] | None = None
    rule: Rule | None = None
    needs_approval: bool = False

    @property
    def action(self) -> Action:
        if not self.allowed:
            return "deny"
        return "ask" if self.needs_approval else "allow"

    @property
    def reason(self) -> str:
        if self.rule is None:
            return "allowed (no rule matches)"
        if self.needs_approval:
            return f"needs approval by the {self.scope} policy rule {self.rule.tool!r}"
        verb = "allowed" if self.allowed else "denied"
        return f"{verb} by the {self.scope} policy rule {self.rule.tool!r}"
