"""Stored rows of users' MCP servers and HTTP tools (and policies' rules) as values, with
their secrets: MCP header values, a stdio server's env and HTTP tool header values are sealed
with the service's Fernet box before they reach the database and opened only when a row is
read back (the API shows them as `***`). A row whose secrets do not open (sealed under
another key) is `Sealed`; the agent runtime's read leaves such a row out with a warning
(`readable`), so one bad row does not break every task of every user.

Separate from the store's SQL (`_store`): this is the one place that holds the key and knows
how a column becomes a field; the store only says which rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from cryptography.fernet import Fernet, InvalidToken

from orchestrator.tools._model import HttpTool, McpServer, McpToolInfo, Rule

__all__ = ["Sealed", "ToolRows", "json_value", "rules_of"]

log = logging.getLogger(__name__)
_Row = TypeVar("_Row", McpServer, HttpTool)


class Sealed(RuntimeError):
    """Secrets that do not open with this service's key."""


def json_value(value: Any) -> Any:
    """A JSON column's (or aggregate's) value, decoded when it comes as text."""
    return json.loads(value) if isinstance(value, str) else value


def rules_of(value: Any) -> tuple[Rule, ...]:
    """A `tool_policies.rules` value as `Rule`s (none for a scope without a row)."""
    return tuple(Rule(r["tool"], r["action"]) for r in json_value(value) or ())


class ToolRows:
    """Rows of `mcp_servers` and `http_tools` <-> `McpServer` and `HttpTool`, secrets sealed
    and opened with `box`."""

    def __init__(self, box: Fernet) -> None:
        self._box = box

    def seal(self, values: Mapping[str, str]) -> bytes | None:
        return self._box.encrypt(json.dumps(dict(values)).encode()) if values else None

    def open(self, sealed: bytes | str | None) -> dict[str, str]:
        if not sealed:
            return {}
        token = sealed.encode() if isinstance(sealed, str) else bytes(sealed)
        try:
            data: dict[str, str] = json.loads(self._box.decrypt(token))
        except InvalidToken as exc:
            raise Sealed(
                "tool secrets cannot be decrypted: channel_secret_key (or"
                " <data_dir>/channel_key) is not the key they were stored with"
            ) from exc
        return data

    def server(self, row: Mapping[str, Any]) -> McpServer:
        return McpServer(
            id=f"mcp-{row['id']}",
            owner=row["owner"],
            name=row["name"],
            transport=row["transport"],
            url=row["url"],
            headers=self.open(row["headers"]),
            command=row["command"],
            args=tuple(json_value(row["args"]) or ()),
            env=self.open(row["env"]),
            shared=row["shared"],
            status=row["status"],
            error=row["error"],
            tools=tuple(
                McpToolInfo(t["name"], t.get("description") or "", t.get("input_schema") or {})
                for t in json_value(row["tools"]) or ()
            ),
            version=row["version"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    def http(self, row: Mapping[str, Any]) -> HttpTool:
        return HttpTool(
            id=f"http-{row['id']}",
            user_uuid=row["user_uuid"],
            name=row["name"],
            description=row["description"],
            parameters=json_value(row["parameters"]),
            method=row["method"],
            url=row["url"],
            headers=self.open(row["headers"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @staticmethod
    def readable(
        read: Callable[[Mapping[str, Any]], _Row], rows: Sequence[Mapping[str, Any]], what: str
    ) -> list[_Row]:
        """The rows whose secrets open; each other one is left out with a warning naming it
        (a row sealed on a node with another key must not break every task of every user)."""
        out: list[_Row] = []
        for row in rows:
            try:
                out.append(read(row))
            except Sealed:
                log.warning(
                    "%s-%s left out of the user's tools: its secrets do not open with this"
                    " service's key (channel_secret_key)",
                    what,
                    row["id"],
                )
        return out
