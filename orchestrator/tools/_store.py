"""Users' agent tools in Postgres: MCP servers (own, and shared by admins), HTTP tools, and the
tool policies (global and per user).

Every statement is scoped by the caller in its SQL: another user's server or tool is not found
(a 404), a shared server is readable by everyone and changed by admins only. Secret values are
sealed before they reach the database and opened only when read back (`_rows`).

Names: an MCP server's name is unique among its owner's own servers and among the shared
ones, and an own server may not take a shared server's name (its tools would be offered under
the same `mcp__<name>__` prefix). The two unique indexes cannot say the last part: it is
checked under an advisory lock on the name, taken by every write that sets one. A shared
server registered after a user's own one of that name is hidden from that user (`for_user`).

A URL (an MCP server's, an HTTP tool's) is saved only if its host resolves to no address the
egress guard refuses (`destination_refused`, the check each connect makes): `localhost` or a
name pointing at the metadata service is a 400 when saved, not a failure at each call. A host
that does not resolve is saved: the connects resolve it again.

The agent runtime reads everything a task may use with `for_user`: one statement per task. A
row whose secrets do not open (sealed under another key) is left out with a warning (`_rows`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
from cryptography.fernet import Fernet

from orchestrator.auth import Principal
from orchestrator.db import DB_NOW_MS
from orchestrator.egress import destination_refused
from orchestrator.errors import Conflict, Forbidden, NotFound, ValidationFailed
from orchestrator.events import EventStore, NewEvent
from orchestrator.tools._http import validate_http_tool
from orchestrator.tools._model import (
    HTTP_ID,
    MCP_ID,
    HttpTool,
    McpServer,
    McpToolInfo,
    Rule,
)
from orchestrator.tools._policy import Policy, parse_rules
from orchestrator.tools._registration import ToolLimits, keep_stored, validate_mcp_server
from orchestrator.tools._rows import ToolRows, json_value, rules_of
from orchestrator.tools._validate import URL_REFUSED, invalid

__all__ = ["StoredPolicy", "ToolLimits", "ToolStore", "UserTools", "validate_mcp_server"]

_LOCK = 947741  # with hashtext(<what>): serialises writes of one MCP server name or owner

_SERVER_COLUMNS = (
    "id, owner, name, transport, url, headers, command, args, env, shared, status, error,"
    " tools, version, created_at, updated_at"
)
_HTTP_COLUMNS = (
    "id, user_uuid, name, description, parameters, method, url, headers, created_at, updated_at"
)
MAX_ERROR = 1000
_VISIBLE = "((owner = $2 AND NOT shared) OR shared)"  # the caller's own servers and the shared


def _over(setting: str, field_name: str, limit: int, what: str) -> ValidationFailed:
    message = f"at most {limit} {what} per user ({setting})"
    return ValidationFailed(
        f"{field_name}: {message}",
        extra={"limit": setting, "fields": [{"field": field_name, "message": message}]},
    )


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserTools:
    """What one user's tasks may reach outside the service: their own MCP servers then the
    shared ones (a shared server whose name an own server has is left out), their HTTP tools,
    and the policy (global and their rules) that every call is checked against. Secrets are
    decrypted."""

    mcp: tuple[McpServer, ...]
    http: tuple[HttpTool, ...]
    policy: Policy


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    """A scope's rules as stored (a user's: with the global rules that bind them too)."""

    scope: Literal["global", "user"]
    user_uuid: str | None
    rules: tuple[Rule, ...]
    global_rules: tuple[Rule, ...]
    updated_at: int | None = None
    updated_by: str | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "user_uuid": self.user_uuid,
            "rules": [r.wire() for r in self.rules],
            "global_rules": [r.wire() for r in self.global_rules],
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }


def _server_id(server_id: str) -> int:
    if not MCP_ID.fullmatch(server_id):
        raise NotFound("MCP server not found")
    return int(server_id[4:])


def _http_id(tool_id: str) -> int:
    if not HTTP_ID.fullmatch(tool_id):
        raise NotFound("HTTP tool not found")
    return int(tool_id[5:])


def _user_scope(user_uuid: str) -> str:
    return f"user:{user_uuid}"


# --- the store ------------------------------------------------------------------------------


class ToolStore:
    """MCP servers, HTTP tools and tool policies. `events` records the permission grants of
    policy writes (in the write's transaction); `limits` are what writes are checked against.
    Without them the store still reads (`for_user`, for the agent runtime)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        box: Fernet,
        *,
        events: EventStore | None = None,
        limits: ToolLimits | None = None,
    ) -> None:
        self._pool = pool
        self._rows = ToolRows(box)
        self._events = events
        self.limits = limits or ToolLimits()

    async def _refused(self, url: Any) -> bool:
        """Whether `url` (one that passed validation) names a host the egress guard refuses:
        resolved outside any transaction (no lock is held while the resolver answers)."""
        return isinstance(url, str) and await destination_refused(self.limits.egress, url)

    # --- MCP servers ------------------------------------------------------------------------

    async def _room_for_server(
        self,
        conn: asyncpg.Connection,
        owner: str,
        name: str,
        *,
        shared: bool,
        count: bool = False,
        server_id: int = 0,
    ) -> None:
        """Within `conn`'s transaction: `name` free for an own (or shared) server of
        `owner` (409 otherwise), and (`count`) room for one more server of `owner`.
        Holds the owner's and the name's locks until the transaction ends."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2)),"
            " pg_advisory_xact_lock($1, hashtext($3))",
            _LOCK,
            f"owner:{owner}",
            f"name:{name}",
        )
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM mcp_servers WHERE owner = $1 AND NOT shared)"
            " + (SELECT count(*) FROM mcp_servers WHERE shared AND owner = $1) AS owned,"
            " EXISTS (SELECT 1 FROM mcp_servers WHERE shared AND name = $2 AND id <> $3)"
            " AS shared_taken,"
            " EXISTS (SELECT 1 FROM mcp_servers WHERE owner = $1 AND NOT shared AND name = $2"
            " AND id <> $3) AS own_taken",
            owner,
            name,
            server_id,
        )
        if row["shared_taken"]:
            raise Conflict(f"a shared MCP server is named {name!r}")
        if row["own_taken"] and not shared:
            raise Conflict(f"you have an MCP server named {name!r}")
        if count and row["owned"] >= self.limits.max_servers:
            raise _over("mcp_max_servers_per_user", "name", self.limits.max_servers, "MCP servers")

    async def create_mcp_server(self, caller: Principal, raw: Mapping[str, Any]) -> McpServer:
        """Register a server of the caller's (admins: also `shared` ones and stdio ones),
        with status `error` "not listed yet" until `record_listing` says what it offers."""
        if raw.get("command") is not None and not caller.is_admin:
            raise Forbidden("only admins register stdio MCP servers")
        if raw.get("shared") is True and not caller.is_admin:
            raise Forbidden("only admins register shared MCP servers")
        spec = validate_mcp_server(raw, self.limits)
        if await self._refused(spec.get("url")):
            raise invalid("url", URL_REFUSED)
        shared = bool(spec.get("shared", False))
        headers = keep_stored("headers", spec.get("headers", {}), {})
        env = keep_stored("env", spec.get("env", {}), {})
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await self._room_for_server(
                    conn, caller.user_uuid, spec["name"], shared=shared, count=True
                )
                row = await conn.fetchrow(
                    "INSERT INTO mcp_servers (owner, name, transport, url, headers, command,"
                    " args, env, shared, status, error, created_at, updated_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, 'error',"
                    f" 'not listed yet', {DB_NOW_MS}, {DB_NOW_MS}) RETURNING {_SERVER_COLUMNS}",
                    caller.user_uuid,
                    spec["name"],
                    spec["transport"],
                    spec.get("url"),
                    self._rows.seal(headers),
                    spec.get("command"),
                    json.dumps(spec.get("args", [])),
                    self._rows.seal(env),
                    shared,
                )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"an MCP server named {spec['name']!r} exists") from None
        return self._rows.server(row)

    async def list_mcp_servers(self, caller: Principal) -> list[McpServer]:
        """The caller's own servers, then the shared ones."""
        rows = await self._pool.fetch(
            f"SELECT {_SERVER_COLUMNS} FROM mcp_servers WHERE (owner = $1 AND NOT shared)"
            " OR shared ORDER BY shared, id",
            caller.user_uuid,
        )
        return [self._rows.server(r) for r in rows]

    async def get_mcp_server(
        self,
        caller: Principal,
        server_id: str,
        conn: asyncpg.Connection | None = None,
        *,
        for_update: bool = False,
    ) -> McpServer:
        """One of the caller's own servers or a shared one (NotFound otherwise); in `conn`'s
        transaction, locked, `for_update`."""
        row = await (conn or self._pool).fetchrow(
            f"SELECT {_SERVER_COLUMNS} FROM mcp_servers WHERE id = $1 AND {_VISIBLE}"
            + (" FOR UPDATE" if for_update else ""),
            _server_id(server_id),
            caller.user_uuid,
        )
        if row is None:
            raise NotFound(f"MCP server {server_id} not found")
        return self._rows.server(row)

    async def editable_mcp_server(self, caller: Principal, server_id: str) -> McpServer:
        """A server the caller may change: their own, or (admins) a shared one."""
        server = await self.get_mcp_server(caller, server_id)
        if server.shared and not caller.is_admin:
            raise Forbidden("only admins change shared MCP servers")
        return server

    async def update_mcp_server(
        self, caller: Principal, server_id: str, raw: Mapping[str, Any]
    ) -> tuple[McpServer, bool]:
        """Apply a PUT's changes; the server, and whether how to connect changed (its
        `version` bumped, its tools cleared: list them again). Headers (env) given replace
        the stored ones; `***` keeps a stored value."""
        key = _server_id(server_id)
        # Resolved before the row is locked; judged once the change is known to be valid.
        refused = await self._refused(raw.get("url"))
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                current = await self.get_mcp_server(caller, server_id, conn, for_update=True)
                if current.shared and not caller.is_admin:
                    raise Forbidden("only admins change shared MCP servers")
                changes = validate_mcp_server(
                    raw, self.limits, partial=True, transport=current.transport
                )
                if changes.get("shared", current.shared) != current.shared:
                    raise invalid("shared", "cannot be changed: register the server again")
                if "url" in changes and refused:
                    raise invalid("url", URL_REFUSED)
                name = changes.get("name", current.name)
                url = changes.get("url", current.url)
                headers = keep_stored(
                    "headers", changes.get("headers", current.headers), current.headers
                )
                command = changes.get("command", current.command)
                args = tuple(changes.get("args", current.args))
                env = keep_stored("env", changes.get("env", current.env), current.env)
                reconnect = (url, headers, command, args, env) != (
                    current.url,
                    current.headers,
                    current.command,
                    current.args,
                    current.env,
                )
                if name != current.name:
                    await self._room_for_server(
                        conn, current.owner, name, shared=current.shared, server_id=key
                    )
                # A new way to connect: the tools listed the old way are not this server's.
                row = await conn.fetchrow(
                    "UPDATE mcp_servers SET name = $2, url = $3, headers = $4, command = $5,"
                    " args = $6::jsonb, env = $7, version = version + $8::boolean::int,"
                    " status = CASE WHEN $8 THEN 'error' ELSE status END,"
                    " error = CASE WHEN $8 THEN 'not listed yet' ELSE error END,"
                    " tools = CASE WHEN $8 THEN '[]'::jsonb ELSE tools END,"
                    f" updated_at = {DB_NOW_MS} WHERE id = $1 RETURNING {_SERVER_COLUMNS}",
                    key,
                    name,
                    url,
                    self._rows.seal(headers),
                    command,
                    json.dumps(list(args)),
                    self._rows.seal(env),
                    reconnect,
                )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"an MCP server named {raw.get('name')!r} exists") from None
        return self._rows.server(row), reconnect

    async def delete_mcp_server(self, caller: Principal, server_id: str) -> McpServer:
        """Delete a server the caller may change; the server as it was."""
        await self.editable_mcp_server(caller, server_id)
        row = await self._pool.fetchrow(
            f"DELETE FROM mcp_servers WHERE id = $1 AND {_VISIBLE} RETURNING {_SERVER_COLUMNS}",
            _server_id(server_id),
            caller.user_uuid,
        )
        if row is None:
            raise NotFound(f"MCP server {server_id} not found")
        return self._rows.server(row)

    async def record_listing(
        self,
        server: McpServer,
        tools: Sequence[McpToolInfo] = (),
        *,
        error: str | None = None,
    ) -> McpServer:
        """What listing `server`'s tools gave: its tools (status `ready`), or the error
        (status `error`, the tools kept from the last good listing). Ignored when the
        server changed since (another `version`): the server as it now is."""
        listed = json.dumps([t.wire() for t in tools])
        row = await self._pool.fetchrow(
            "UPDATE mcp_servers SET status = $3,"
            " error = $4, tools = CASE WHEN $3 = 'ready' THEN $5::jsonb ELSE tools END,"
            f" updated_at = {DB_NOW_MS} WHERE id = $1 AND version = $2"
            f" RETURNING {_SERVER_COLUMNS}",
            int(server.id[4:]),
            server.version,
            "error" if error is not None else "ready",
            None if error is None else error[:MAX_ERROR],
            listed,
        )
        if row is None:
            row = await self._pool.fetchrow(
                f"SELECT {_SERVER_COLUMNS} FROM mcp_servers WHERE id = $1", int(server.id[4:])
            )
            if row is None:
                raise NotFound(f"MCP server {server.id} not found")
        return self._rows.server(row)

    # --- HTTP tools -------------------------------------------------------------------------

    async def create_http_tool(self, caller: Principal, raw: Mapping[str, Any]) -> HttpTool:
        spec = validate_http_tool(raw, self.limits.egress)
        if await self._refused(spec["url"]):
            raise invalid("url", URL_REFUSED)
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                    _LOCK,
                    f"http:{caller.user_uuid}",
                )
                count = await conn.fetchval(
                    "SELECT count(*) FROM http_tools WHERE user_uuid = $1", caller.user_uuid
                )
                if count >= self.limits.max_http_tools:
                    raise _over(
                        "http_tools_max_per_user", "name", self.limits.max_http_tools, "HTTP tools"
                    )
                row = await conn.fetchrow(
                    "INSERT INTO http_tools (user_uuid, name, description, parameters, method,"
                    f" url, headers, created_at, updated_at) VALUES ($1, $2, $3, $4::jsonb, $5,"
                    f" $6, $7, {DB_NOW_MS}, {DB_NOW_MS}) RETURNING {_HTTP_COLUMNS}",
                    caller.user_uuid,
                    spec["name"],
                    spec["description"],
                    json.dumps(spec["parameters"]),
                    spec["method"],
                    spec["url"],
                    self._rows.seal(keep_stored("headers", spec["headers"], {})),
                )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"you have an HTTP tool named {spec['name']!r}") from None
        return self._rows.http(row)

    async def list_http_tools(self, caller: Principal) -> list[HttpTool]:
        rows = await self._pool.fetch(
            f"SELECT {_HTTP_COLUMNS} FROM http_tools WHERE user_uuid = $1 ORDER BY name",
            caller.user_uuid,
        )
        return [self._rows.http(r) for r in rows]

    async def get_http_tool(
        self,
        caller: Principal,
        tool_id: str,
        conn: asyncpg.Connection | None = None,
        *,
        for_update: bool = False,
    ) -> HttpTool:
        """One of the caller's HTTP tools (NotFound otherwise); in `conn`'s transaction,
        locked, `for_update`."""
        row = await (conn or self._pool).fetchrow(
            f"SELECT {_HTTP_COLUMNS} FROM http_tools WHERE id = $1 AND user_uuid = $2"
            + (" FOR UPDATE" if for_update else ""),
            _http_id(tool_id),
            caller.user_uuid,
        )
        if row is None:
            raise NotFound(f"HTTP tool {tool_id} not found")
        return self._rows.http(row)

    async def update_http_tool(
        self, caller: Principal, tool_id: str, raw: Mapping[str, Any]
    ) -> HttpTool:
        """Apply a PUT's changes, checked as a whole (a new URL's placeholders against the
        parameters kept, say). Headers given replace the stored ones; `***` keeps a value."""
        key = _http_id(tool_id)
        changes = validate_http_tool(
            {k: v for k, v in raw.items() if v is not None}, self.limits.egress, partial=True
        )
        if await self._refused(changes.get("url")):
            raise invalid("url", URL_REFUSED)
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                current = await self.get_http_tool(caller, tool_id, conn, for_update=True)
                merged = {
                    "name": current.name,
                    "description": current.description,
                    "parameters": current.parameters,
                    "method": current.method,
                    "url": current.url,
                    **changes,
                }
                merged["headers"] = keep_stored(
                    "headers", changes.get("headers", current.headers), current.headers
                )
                spec = validate_http_tool(merged, self.limits.egress)
                row = await conn.fetchrow(
                    "UPDATE http_tools SET name = $3, description = $4, parameters = $5::jsonb,"
                    f" method = $6, url = $7, headers = $8, updated_at = {DB_NOW_MS}"
                    f" WHERE id = $1 AND user_uuid = $2 RETURNING {_HTTP_COLUMNS}",
                    key,
                    caller.user_uuid,
                    spec["name"],
                    spec["description"],
                    json.dumps(spec["parameters"]),
                    spec["method"],
                    spec["url"],
                    self._rows.seal(spec["headers"]),
                )
        except asyncpg.UniqueViolationError:
            raise Conflict("you have an HTTP tool of that name") from None
        return self._rows.http(row)

    async def delete_http_tool(self, caller: Principal, tool_id: str) -> None:
        deleted = await self._pool.fetchval(
            "DELETE FROM http_tools WHERE id = $1 AND user_uuid = $2 RETURNING id",
            _http_id(tool_id),
            caller.user_uuid,
        )
        if deleted is None:
            raise NotFound(f"HTTP tool {tool_id} not found")

    # --- policies ---------------------------------------------------------------------------

    @staticmethod
    def policy_scope(
        caller: Principal, scope: str | None, user_uuid: str | None
    ) -> tuple[Literal["global", "user"], str | None]:
        """Whose rules a request names: the caller's own by default; another user's
        (`user_uuid`) or the global ones (`scope=global`) for admins only."""
        if scope not in (None, "user", "global"):
            raise invalid("scope", "user or global")
        if scope == "global":
            if user_uuid is not None:
                raise invalid("user_uuid", "not with scope=global")
            if not caller.is_admin:
                raise Forbidden("the global tool policy is admin only")
            return "global", None
        if user_uuid is not None and user_uuid != caller.user_uuid:
            if not caller.is_admin:
                raise Forbidden("another user's tool policy is admin only")
            if not user_uuid or len(user_uuid) > 256:
                raise invalid("user_uuid", "1-256 characters")
            return "user", user_uuid
        return "user", caller.user_uuid

    async def get_policy(
        self, caller: Principal, *, scope: str | None = None, user_uuid: str | None = None
    ) -> StoredPolicy:
        kind, whose = self.policy_scope(caller, scope, user_uuid)
        key = "global" if whose is None else _user_scope(whose)
        row = await self._pool.fetchrow(
            "SELECT (SELECT rules FROM tool_policies WHERE scope = 'global') AS global_rules,"
            " p.rules, p.updated_at, p.updated_by FROM (SELECT 1) one"
            " LEFT JOIN tool_policies p ON p.scope = $1",
            key,
        )
        return StoredPolicy(
            scope=kind,
            user_uuid=whose,
            rules=rules_of(row["rules"]),
            global_rules=rules_of(row["global_rules"]),
            updated_at=row["updated_at"],
            updated_by=row["updated_by"],
        )

    async def set_policy(
        self,
        caller: Principal,
        rules: Any,
        *,
        scope: str | None = None,
        user_uuid: str | None = None,
    ) -> StoredPolicy:
        """Replace a scope's rules. Each `allow` rule a user did not have before is an
        `audit.permission_grant` of that user's, appended in the same transaction."""
        if self._events is None:
            raise RuntimeError("ToolStore.set_policy needs the event store (events=)")
        kind, whose = self.policy_scope(caller, scope, user_uuid)
        parsed = parse_rules(rules)
        key = "global" if whose is None else _user_scope(whose)
        async with self._events.transaction() as tx:
            await tx.conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK, key)
            before = rules_of(
                await tx.conn.fetchval("SELECT rules FROM tool_policies WHERE scope = $1", key)
            )
            row = await tx.conn.fetchrow(
                "INSERT INTO tool_policies (scope, rules, updated_at, updated_by)"
                f" VALUES ($1, $2::jsonb, {DB_NOW_MS}, $3) ON CONFLICT (scope) DO UPDATE"
                " SET rules = excluded.rules, updated_at = excluded.updated_at,"
                " updated_by = excluded.updated_by RETURNING updated_at,"
                " (SELECT rules FROM tool_policies WHERE scope = 'global') AS global_rules",
                key,
                json.dumps([r.wire() for r in parsed]),
                caller.user_uuid,
            )
            if whose is not None:
                had = {r.tool for r in before if r.action == "allow"}
                granted = [r.tool for r in parsed if r.action == "allow" and r.tool not in had]
                await tx.append(
                    [
                        NewEvent(
                            "audit.permission_grant",
                            {
                                "user_uuid": whose,
                                "permission": f"tool:{tool}",
                                "granted_by": caller.user_uuid,
                            },
                            user_uuid=whose,
                        )
                        for tool in dict.fromkeys(granted)
                    ]
                )
        global_rules = parsed if whose is None else rules_of(row["global_rules"])
        return StoredPolicy(
            scope=kind,
            user_uuid=whose,
            rules=parsed,
            global_rules=global_rules,
            updated_at=row["updated_at"],
            updated_by=caller.user_uuid,
        )

    # --- what a task may use ----------------------------------------------------------------

    async def for_user(self, user_uuid: str) -> UserTools:
        """Everything `user_uuid`'s tasks may reach, secrets decrypted, in one statement."""
        row = await self._pool.fetchrow(
            "SELECT"
            " (SELECT coalesce(json_agg(s ORDER BY s.shared, s.id), '[]') FROM ("
            "  SELECT id, owner, name, transport, url, convert_from(headers, 'UTF8') AS headers,"
            "  command, args, convert_from(env, 'UTF8') AS env, shared, status, error, tools,"
            "  version, created_at, updated_at FROM mcp_servers m"
            "  WHERE (m.owner = $1 AND NOT m.shared) OR (m.shared AND NOT EXISTS ("
            "   SELECT 1 FROM mcp_servers o WHERE o.owner = $1 AND NOT o.shared"
            "   AND o.name = m.name))) s) AS mcp,"
            " (SELECT coalesce(json_agg(h ORDER BY h.name), '[]') FROM ("
            "  SELECT id, user_uuid, name, description, parameters, method, url,"
            "  convert_from(headers, 'UTF8') AS headers, created_at, updated_at"
            "  FROM http_tools WHERE user_uuid = $1) h) AS http,"
            " (SELECT rules FROM tool_policies WHERE scope = 'global') AS global_rules,"
            " (SELECT rules FROM tool_policies WHERE scope = $2) AS user_rules",
            user_uuid,
            _user_scope(user_uuid),
        )
        rows = self._rows
        return UserTools(
            mcp=tuple(rows.readable(rows.server, json_value(row["mcp"]), "MCP server mcp")),
            http=tuple(rows.readable(rows.http, json_value(row["http"]), "HTTP tool http")),
            policy=Policy(rules_of(row["global_rules"]), rules_of(row["user_rules"])),
        )
