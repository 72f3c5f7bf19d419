"""What registering an MCP server may say: a streamable-HTTP server's URL (through the egress
guard, as webhooks are) and headers, a stdio server's command (one the operator allowed),
arguments and environment. Header and env values are secrets: no message here quotes one.
The store (`_store.py`) checks who may register what (stdio and shared servers: admins)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from orchestrator.config import Settings
from orchestrator.egress import EgressPolicy
from orchestrator.errors import ValidationFailed
from orchestrator.observability import REDACTED
from orchestrator.tools._model import NAME_PATTERN

__all__ = ["ToolLimits", "invalid", "keep_stored", "validate_mcp_server"]

MAX_URL = 2048
MAX_HEADERS = 32
MAX_HEADER_VALUE = 8192
MAX_ARGS = 64
MAX_ARG = 4096
MAX_ENV = 64
MAX_ENV_VALUE = 32_768
# The MCP client frames its requests and keeps its session in these.
REFUSED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "content-type",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
    }
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")  # RFC 9110 token
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_URL_CHARS = re.compile(r"[\x21-\x7e]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_FIELDS = ("name", "url", "headers", "command", "args", "env", "shared")


def invalid(field_name: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"{field_name}: {message}",
        extra={"fields": [{"field": field_name, "message": message}]},
    )


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
        if not isinstance(given["name"], str) or not NAME_PATTERN.fullmatch(given["name"]):
            raise invalid("name", "1-32 characters of a-z 0-9 _ -")
        out["name"] = given["name"]
    if "shared" in given:
        if not isinstance(given["shared"], bool):
            raise invalid("shared", "true or false")
        out["shared"] = given["shared"]
    if "url" in given:
        out["url"] = _url(given["url"], limits.egress)
    if "headers" in given:
        out["headers"] = _secrets("headers", given["headers"], _header_name, MAX_HEADERS)
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
        out["env"] = _secrets("env", given["env"], _env_name, MAX_ENV)
    if not partial and transport == "streamable_http":
        out.setdefault("headers", {})
    if not partial and transport == "stdio":
        out.setdefault("args", [])
        out.setdefault("env", {})
    return out


def _url(value: Any, egress: EgressPolicy) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_URL:
        raise invalid("url", f"an http or https URL of at most {MAX_URL} characters")
    if not _URL_CHARS.fullmatch(value):
        raise invalid("url", "no spaces, control or non-ASCII characters (percent-encode them)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise invalid("url", "not a valid URL (its host or port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid("url", "an absolute http or https URL")
    if "@" in parts.netloc:
        raise invalid("url", "no credentials in the URL: put them in headers (kept secret)")
    if egress.literal_refused(value):
        raise invalid("url", "destination not allowed (outbound_allowed_cidrs)")
    return value


def _header_name(name: str) -> str | None:
    if not _TOKEN.fullmatch(name):
        return "not a valid header name"
    if name.lower() in REFUSED_HEADERS:
        return "set by the service, not by a server's settings"
    return None


def _env_name(name: str) -> str | None:
    return None if _ENV_NAME.fullmatch(name) else "not a valid environment variable name"


def _secrets(where: str, value: Any, check_name: Any, most: int) -> dict[str, str]:
    """A map of names to secret values (header values, env): the messages never quote a
    value. `***` stands for the value stored under that name (`_keep`)."""
    if not isinstance(value, Mapping):
        raise invalid(where, "an object of names to string values")
    if len(value) > most:
        raise invalid(where, f"at most {most} entries")
    seen: set[str] = set()
    out: dict[str, str] = {}
    for name, secret in value.items():
        problem = check_name(name) if isinstance(name, str) else "not a string"
        if problem is not None:
            raise invalid(f"{where}.{str(name)[:64]}", problem)
        if name.lower() in seen and where == "headers":
            raise invalid(f"{where}.{name}", "given twice (header names ignore case)")
        seen.add(name.lower())
        if where == "headers":
            if not isinstance(secret, str) or not _PRINTABLE.fullmatch(secret):
                raise invalid(f"{where}.{name}", "the value must be a string of printable ASCII")
            if len(secret) > MAX_HEADER_VALUE:
                raise invalid(f"{where}.{name}", f"at most {MAX_HEADER_VALUE} characters")
        elif not isinstance(secret, str) or "\x00" in secret or len(secret) > MAX_ENV_VALUE:
            raise invalid(f"{where}.{name}", f"a string of at most {MAX_ENV_VALUE} characters")
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
