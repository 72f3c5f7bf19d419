"""Memory tools for the agent runtime: `memory_store`, `memory_get`, `memory_search`, acting
as the task's user (ownership and namespaces as over HTTP). The host puts its MemoryStore
in the runner's services under "memory"."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agents import Tool, ToolContext, ToolFailed
from orchestrator.auth import Principal
from orchestrator.errors import OrchestratorError
from orchestrator.memory._store import MemoryStore

_AGENT = {"type": "string", "description": "Namespace (default: `default`)"}


def _store(ctx: ToolContext) -> tuple[MemoryStore, Principal]:
    store = ctx.services.get("memory")
    if not isinstance(store, MemoryStore) or not ctx.settings.memory_enabled:
        raise ToolFailed("memory is not available here")
    return store, Principal(ctx.task.user_uuid)


def _agent(ctx: ToolContext, args: dict[str, Any]) -> str:
    agent = str(args.get("agent_id") or "default")
    longest = ctx.settings.memory_agent_id_max
    if len(agent) > longest:
        raise ToolFailed(f"agent_id: at most {longest} characters (memory_agent_id_max)")
    return agent


def _text(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise ToolFailed(f"'{name}' (a non-empty string) is required")
    return value


MAX_TTL_MS = 10 * 366 * 86_400_000


async def _memory_store(ctx: ToolContext, args: dict[str, Any]) -> str:
    store, who = _store(ctx)
    ttl = args.get("ttl")
    if ttl is not None and (not isinstance(ttl, int) or not 0 <= ttl <= MAX_TTL_MS):
        raise ToolFailed("'ttl' is milliseconds (a non-negative integer, at most ten years)")
    try:
        await store.store(
            _agent(ctx, args), _text(args, "key"), _text(args, "value"), who, ttl_ms=ttl or None
        )
    except OrchestratorError as exc:
        raise ToolFailed(exc.message) from exc
    return "stored"


async def _memory_get(ctx: ToolContext, args: dict[str, Any]) -> str:
    store, who = _store(ctx)
    try:
        entry = await store.get(_agent(ctx, args), _text(args, "key"), who)
    except OrchestratorError as exc:
        raise ToolFailed(exc.message) from exc
    return entry.value


async def _memory_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    store, who = _store(ctx)
    given = args.get("limit")
    limit = given if isinstance(given, int) else 5
    found = await store.search(_agent(ctx, args), _text(args, "query"), who, max(1, min(limit, 50)))
    return json.dumps([{"key": e.key, "value": e.value} for e in found])


MEMORY_TOOLS: tuple[Tool, ...] = (
    Tool(
        "memory_store",
        "Remember a value under a key (overwrites your own entry of that key).",
        {
            "type": "object",
            "properties": {
                "key": {"type": "string"},
                "value": {"type": "string"},
                "ttl": {"type": "integer", "description": "Forget after this many ms"},
                "agent_id": _AGENT,
            },
            "required": ["key", "value"],
        },
        _memory_store,
        source="memory",
    ),
    Tool(
        "memory_get",
        "Recall the value stored under a key.",
        {
            "type": "object",
            "properties": {"key": {"type": "string"}, "agent_id": _AGENT},
            "required": ["key"],
        },
        _memory_get,
        source="memory",
    ),
    Tool(
        "memory_search",
        "Full-text search of remembered entries; a JSON list of {key, value}, best first.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "description": "At most this many (5)"},
                "agent_id": _AGENT,
            },
            "required": ["query"],
        },
        _memory_search,
        source="memory",
    ),
)
