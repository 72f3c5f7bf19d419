"""Workspace tools for the agent runtime: `workspace_read`, `workspace_write`,
`workspace_edit`, `workspace_search`, `workspace_list`, acting in the task's user's workspace
with the same rules as over HTTP. The host puts its Workspace in the runner's services under
"workspace"."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agents import Tool, ToolContext, ToolFailed
from orchestrator.errors import OrchestratorError
from orchestrator.workspace._files import Workspace

DEFAULT_SEARCH_RESULTS = 50
MAX_TOOL_SEARCH_RESULTS = 500
_PATH = {"type": "string", "description": "Relative to your workspace root, '/'-separated"}


def _workspace(ctx: ToolContext) -> tuple[Workspace, str]:
    workspace = ctx.services.get("workspace")
    if not isinstance(workspace, Workspace):
        raise ToolFailed("the workspace is not available here")
    return workspace, ctx.task.user_uuid


def _text(args: dict[str, Any], name: str, *, empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str) or (not value and not empty):
        raise ToolFailed(f"'{name}' (a {'' if empty else 'non-empty '}string) is required")
    return value


def _failed(exc: OrchestratorError) -> ToolFailed:
    if exc.code == "multiple_matches":
        return ToolFailed(
            f"old_text occurs {exc.extra.get('matches')} times; include more of the "
            "surrounding text so that it occurs exactly once"
        )
    return ToolFailed(exc.message)


async def _read(ctx: ToolContext, args: dict[str, Any]) -> str:
    workspace, user = _workspace(ctx)
    try:
        found = await workspace.read(user, _text(args, "path"))
    except OrchestratorError as exc:
        raise _failed(exc) from exc
    if found.encoding != "utf-8":
        # base64 of a binary file is no use to a model, and a large waste of its context.
        raise ToolFailed(f"{found.path!r} is a binary file ({found.size} bytes), not text")
    return found.content


async def _write(ctx: ToolContext, args: dict[str, Any]) -> str:
    workspace, user = _workspace(ctx)
    try:
        done = await workspace.write(user, _text(args, "path"), _text(args, "content", empty=True))
    except OrchestratorError as exc:
        raise _failed(exc) from exc
    return f"{'created' if done.created else 'replaced'} {done.path} ({done.size} bytes)"


async def _edit(ctx: ToolContext, args: dict[str, Any]) -> str:
    workspace, user = _workspace(ctx)
    try:
        done = await workspace.edit(
            user,
            _text(args, "path"),
            _text(args, "old_text"),
            _text(args, "new_text", empty=True),
        )
    except OrchestratorError as exc:
        raise _failed(exc) from exc
    return f"edited {done.path} ({done.size} bytes)"


async def _search(ctx: ToolContext, args: dict[str, Any]) -> str:
    workspace, user = _workspace(ctx)
    given = args.get("max_results")
    limit = given if isinstance(given, int) and not isinstance(given, bool) else 0
    limit = max(1, min(limit or DEFAULT_SEARCH_RESULTS, MAX_TOOL_SEARCH_RESULTS))
    try:
        found = await workspace.search(user, _text(args, "query"), limit)
    except OrchestratorError as exc:
        raise _failed(exc) from exc
    return json.dumps(
        {
            "results": [{"path": f.path, "size": f.size} for f in found.results],
            "truncated": found.truncated,
        }
    )


async def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    workspace, user = _workspace(ctx)
    path = args.get("path") or ""
    if not isinstance(path, str):
        raise ToolFailed("'path' must be a string")
    try:
        listing = await workspace.list_dir(user, path, args.get("recursive") is True)
    except OrchestratorError as exc:
        raise _failed(exc) from exc
    return json.dumps(
        {
            "entries": [{"path": e.path, "type": e.type, "size": e.size} for e in listing.entries],
            "truncated": listing.truncated,
        }
    )


WORKSPACE_TOOLS: tuple[Tool, ...] = (
    Tool(
        "workspace_read",
        "Read a text file of your workspace.",
        {"type": "object", "properties": {"path": _PATH}, "required": ["path"]},
        _read,
        source="workspace",
    ),
    Tool(
        "workspace_write",
        "Create or replace a file of your workspace (parent directories are created).",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
        _write,
        source="workspace",
    ),
    Tool(
        "workspace_edit",
        "Replace old_text with new_text in a file; old_text must occur exactly once "
        "(whitespace included).",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "old_text": {"type": "string"},
                "new_text": {"type": "string"},
            },
            "required": ["path", "old_text", "new_text"],
        },
        _edit,
        source="workspace",
    ),
    Tool(
        "workspace_search",
        "Find files by glob (`*` within a name, `**` any number of directories, e.g. "
        "`**/*.py`); a JSON object with `results` [{path, size}].",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "A glob"},
                "max_results": {"type": "integer", "description": "At most this many (50)"},
            },
            "required": ["query"],
        },
        _search,
        source="workspace",
    ),
    Tool(
        "workspace_list",
        "List a directory of your workspace (the root when path is empty); a JSON object "
        "with `entries` [{path, type, size}].",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "recursive": {"type": "boolean", "description": "The whole tree (false)"},
            },
        },
        _list,
        source="workspace",
    ),
)
