"""What registering an MCP server may say: a streamable-HTTP server's URL (through the egress
guard, as webhooks are) and headers, a stdio server's command (one the operator allowed),
arguments and environment. Header and env values are secrets: no message here quotes one.
The name, URL and header checks are the ones HTTP tools get too (`_validate.py`), with the MCP
client's own headers refused besides. The store (`_store.py`) checks who may register what
(stdio and shared servers: admins) and resolves the URL's host through the egress guard."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import Settings
from orchestrator.egress import EgressPolicy
from orchestrator.observability import REDACTED
from orchestrator.tools._validate import (
    MCP_CLIENT_HEADERS,
    invalid,
    validate_headers,
    validate_name,
    validate_url,
)

__all__ = ["ToolLimits", "keep_stored", "validate_mcp_server"]

MAX_ARGS = 64
MAX_ARG = 4096
MAX_ENV = 64
MAX_ENV_VALUE = 32_768
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_FIELDS = ("name", "url", "headers", "command", "args", "env", "shared")


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """What the store checks writes against (from Settings: `ToolLimits.of`)."""

    egress: EgressPolicy = field(default_factory=EgressPolicy)
    stdio_commands: frozenset[str] = frozenset()
    max_servers: int = 50
    max_http_tools: int = 200

    @classmethod
    def of(cls, settings: Settings) -> ToolLimits:
        return cls(
            egress=EgressPolicy(settings.outbound_allowed_cidrs),
            stdio_commands=frozenset(settings.mcp_stdio_commands),
            max_servers=settings.mcp_max_servers_per_user,
            max_http_tools=settings.http_tools_max_per_user,
        )


# --- validation of an MCP server ------------------------------------------------------------


def validate_mcp_server(
    raw: Mapping[str, Any],
    limits: ToolLimits,
    *,
    partial: bool = False,
    transport: str | None = None,
) -> dict[str, Any]:
    """A registration (`partial=False`) or a PUT's changes (`partial=True`, of a server of
    `transport`), normalised; keys given as null count as absent. ValidationFailed names the
    first bad field. Who may register what (stdio, shared) is the store's check."""
    given = {k: v for k, v in raw.items() if v is not None}
    for key in given:
        if key not in _FIELDS:
            raise invalid(str(key), "unknown field")
    if transport is None:
        if "url" in given and "command" in given:
            raise invalid("command", "give url (streamable HTTP) or command (stdio), not both")
        if "url" not in given and "command" not in given:
            raise invalid("url", "required (or command, for a stdio server)")
        transport = "stdio" if "command" in given else "streamable_http"
    out: dict[str, Any] = {}
    if not partial:
        out["transport"] = transport
        if "name" not in given:
            raise invalid("name", "required")
    wrong = ("command", "args", "env") if transport == "streamable_http" else ("url", "headers")
    for key in wrong:
        if key in given:
            kind = "stdio" if transport == "streamable_http" else "streamable HTTP"
            raise invalid(key, f"only for {kind} servers")
    if "name" in given:
        out["name"] = validate_name(given["name"])
    if "shared" in given:
        if not isinstance(given["shared"], bool):
            raise invalid("shared", "true or false")
        out["shared"] = given["shared"]
    if "url" in given:
        out["url"] = validate_url(given["url"], limits.egress)
    if "headers" in given:
        out["headers"] = validate_headers(given["headers"], refused=MCP_CLIENT_HEADERS)
    if "command" in given:
        command = given["command"]
        if not isinstance(command, str) or command not in limits.stdio_commands:
            raise invalid("command", "not one of the commands allowed (mcp_stdio_commands)")
        out["command"] = command
    if "args" in given:
        args = given["args"]
        if not isinstance(args, list) or len(args) > MAX_ARGS:
            raise invalid("args", f"a list of at most {MAX_ARGS} strings")
        for i, arg in enumerate(args):
            if not isinstance(arg, str) or "\x00" in arg or len(arg) > MAX_ARG:
                raise invalid(f"args[{i}]", f"a string of at most {MAX_ARG} characters, no NUL")
        out["args"] = list(args)
    if "env" in given:
        out["env"] = _env(given["env"])
    if not partial and transport == "streamable_http":
        out.setdefault("headers", {})
    if not partial and transport == "stdio":
        out.setdefault("args", [])
        out.setdefault("env", {})
    return out


def _env(value: Any) -> dict[str, str]:
    """A stdio server's environment: names to values (secrets: no message quotes one)."""
    if not isinstance(value, Mapping):
        raise invalid("env", "an object of names to string values")
    if len(value) > MAX_ENV:
        raise invalid("env", f"at most {MAX_ENV} entries")
    out: dict[str, str] = {}
    for name, secret in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise invalid(f"env.{str(name)[:64]}", "not a valid environment variable name")
        if not isinstance(secret, str) or "\x00" in secret or len(secret) > MAX_ENV_VALUE:
            raise invalid(f"env.{name}", f"a string of at most {MAX_ENV_VALUE} characters")
        out[name] = secret
    return out


def keep_stored(where: str, new: Mapping[str, str], stored: Mapping[str, str]) -> dict[str, str]:
    """`new` with each `***` replaced by the stored value of that name: a client that sends
    back what it read keeps the secrets it cannot see."""
    out: dict[str, str] = {}
    for name, value in new.items():
        if value == REDACTED:
            if name not in stored:
                raise invalid(f"{where}.{name}", "*** stands for the stored value: there is none")
            value = stored[name]
        out[name] = value
    return out
