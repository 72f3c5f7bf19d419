"""Marketplace tools for the agent runtime: `marketplace_search` and `marketplace_read`, so an
agent can find and read skills itself (a workflow step's own skills are pinned when the
workflow is created instead). Every skill is readable by every user, so they act for no one
in particular; a read counts a download exactly as GET /marketplace/detail does (the same
store method). The host puts its Marketplace in the runner's services under "marketplace"."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agents import Tool, ToolContext, ToolFailed
from orchestrator.errors import Conflict, OrchestratorError
from orchestrator.marketplace._store import Marketplace

SEARCH_LIMIT = 20  # results one search returns at most
SEARCH_DEFAULT = 10


def _marketplace(ctx: ToolContext) -> Marketplace:
    found = ctx.services.get("marketplace")
    if not isinstance(found, Marketplace):
        raise ToolFailed("the marketplace is not available here")
    return found


def _text(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolFailed(f"'{name}' (a non-empty string) is required")
    return value


async def _search(ctx: ToolContext, args: dict[str, Any]) -> str:
    market = _marketplace(ctx)
    given = args.get("limit", SEARCH_DEFAULT)
    if given is None:
        given = SEARCH_DEFAULT
    if isinstance(given, bool) or not isinstance(given, int):
        raise ToolFailed(f"'limit' is an integer, 1-{SEARCH_LIMIT}")
    try:
        page = await market.search(_text(args, "query"), limit=max(1, min(given, SEARCH_LIMIT)))
    except OrchestratorError as exc:
        raise ToolFailed(exc.message) from exc
    return json.dumps(
        [
            {
                "name": s.name,
                "author": s.author,
                "description": s.description,
                "version": s.version,
                "downloads": s.downloads,
            }
            for s in page.items
        ]
    )


async def _read(ctx: ToolContext, args: dict[str, Any]) -> str:
    market = _marketplace(ctx)
    author = args.get("author")
    if author is not None and (not isinstance(author, str) or not author):
        raise ToolFailed("'author' is the author's user id (a non-empty string)")
    try:
        skill = await market.detail(_text(args, "name"), author)
    except Conflict as exc:
        authors = ", ".join(exc.extra.get("authors", []))
        raise ToolFailed(
            f"several authors publish a skill of that name ({authors}): pass 'author'"
        ) from exc
    except OrchestratorError as exc:
        raise ToolFailed(exc.message) from exc
    return json.dumps(
        {
            "name": skill.name,
            "author": skill.author,
            "version": skill.version,
            "description": skill.description,
            "body": skill.body,
        }
    )


MARKETPLACE_TOOLS: tuple[Tool, ...] = (
    Tool(
        "marketplace_search",
        "Search the skills marketplace by words of a skill's name or description; a JSON "
        "list of {name, author, description, version, downloads}, best first.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {
                    "type": "integer",
                    "description": f"At most this many ({SEARCH_DEFAULT}, at most {SEARCH_LIMIT})",
                },
            },
            "required": ["query"],
        },
        _search,
        source="marketplace",
    ),
    Tool(
        "marketplace_read",
        "Read a marketplace skill: JSON {name, author, version, description, body}; the body "
        "holds its instructions.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "author": {
                    "type": "string",
                    "description": "Its author, when several publish a skill of that name",
                },
            },
            "required": ["name"],
        },
        _read,
        source="marketplace",
    ),
)
