"""SPEC part 4, workspace: file operations inside the caller's workspace root
(`<workspace_root>/<user_uuid>/`, or the root itself when `workspace_isolation` is `shared`).

Unsafe paths (`..`, absolute, NUL or control characters, backslashes, too long, percent-encoded
forms of those, links leading out of the root) are 400 `unsafe_path`; files over
`workspace_max_file_bytes` are 413. Rules in `orchestrator.workspace`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import CurrentUser, Files
from orchestrator import wire
from orchestrator.workspace import MAX_SEARCH_RESULTS, FileInfo

router = APIRouter(tags=["workspace"])

# Generous on purpose: the domain's own limits (1024 bytes, 255 per segment) give the clearer
# message; this only keeps absurd bodies out of it.
PATH_FIELD_MAX = 8192
PathText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=PATH_FIELD_MAX,
        description="Relative to the workspace root, '/'-separated",
    ),
]


ERRORS: dict[int | str, dict[str, object]] = {
    400: {
        "model": wire.WorkspaceError,
        "description": "Unsafe path, bad input, no match, multiple matches",
    },
    404: {"model": wire.WorkspaceError, "description": "No such file or directory"},
    413: {"model": wire.WorkspaceError, "description": "Over workspace_max_file_bytes"},
}


class ReadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText


class WriteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText
    content: str
    encoding: Literal["utf-8", "base64"] = Field(
        "utf-8", description="base64: `content` holds the file's bytes in base64"
    )


class EditBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText
    old_text: str = Field(min_length=1, description="Must occur exactly once")
    new_text: str


class SearchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=PATH_FIELD_MAX,
        description="Glob relative to the root: `*`, `?`, `[..]` within a name; `**` any "
        "number of directories (`**/*.py`)",
    )
    max_results: int = Field(100, ge=1, le=MAX_SEARCH_RESULTS)


def _entry(info: FileInfo) -> wire.DirectoryEntry:
    return wire.DirectoryEntry(
        path=info.path, type=info.type, size=info.size, modified=info.modified
    )


@router.post("/workspace/read", response_model=wire.FileContent, responses=ERRORS)
async def read(body: ReadBody, workspace: Files, caller: CurrentUser) -> wire.FileContent:
    """A file's content: text as is, anything that is not UTF-8 as base64."""
    found = await workspace.read(caller.user_uuid, body.path)
    return wire.FileContent(
        path=found.path, content=found.content, size=found.size, encoding=found.encoding
    )


@router.post("/workspace/write", response_model=wire.FileWritten, responses=ERRORS)
async def write(body: WriteBody, workspace: Files, caller: CurrentUser) -> wire.FileWritten:
    """Create or replace a file atomically (temp file, fsync, rename), making missing
    parent directories."""
    done = await workspace.write(caller.user_uuid, body.path, body.content, body.encoding)
    return wire.FileWritten(path=done.path, size=done.size, created=done.created)


@router.post("/workspace/edit", response_model=wire.FileEdited, responses=ERRORS)
async def edit(body: EditBody, workspace: Files, caller: CurrentUser) -> wire.FileEdited:
    """Replace the one exact occurrence of `old_text`. Several: 400
    `{error: 'multiple matches', matches}`; none: 400 `no_match`; the file is unchanged."""
    done = await workspace.edit(caller.user_uuid, body.path, body.old_text, body.new_text)
    return wire.FileEdited(path=done.path, size=done.size)


@router.post("/workspace/search", response_model=wire.FileSearch, responses=ERRORS)
async def search(body: SearchBody, workspace: Files, caller: CurrentUser) -> wire.FileSearch:
    """Files matching the glob, sorted by path, at most `max_results`."""
    found = await workspace.search(caller.user_uuid, body.query, body.max_results)
    hits = [wire.FileHit(path=f.path, size=f.size, modified=f.modified) for f in found.results]
    return wire.FileSearch(results=hits, count=len(hits), truncated=found.truncated)


@router.get("/workspace/list", response_model=wire.DirectoryListing, responses=ERRORS)
async def list_entries(
    workspace: Files,
    caller: CurrentUser,
    path: Annotated[str, Query(max_length=PATH_FIELD_MAX, description="Directory ('' root)")] = "",
    recursive: bool = False,
) -> wire.DirectoryListing:
    """A directory's files and directories (the whole tree with `recursive`), sorted by
    path; links whose target is outside the root are left out."""
    listing = await workspace.list_dir(caller.user_uuid, path, recursive)
    entries = [_entry(e) for e in listing.entries]
    return wire.DirectoryListing(
        path=listing.path, entries=entries, count=len(entries), truncated=listing.truncated
    )
