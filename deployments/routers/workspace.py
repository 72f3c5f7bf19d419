"""SPEC part 4, workspace: file operations inside the caller's workspace root
(`<workspace_root>/<user_uuid>/`, or the root itself when `workspace_isolation` is `shared`).

Unsafe paths (`..`, absolute, NUL or control characters, backslashes, too long, percent-encoded
forms of those, links leading out of the root) are 400 `unsafe_path`; files over
`workspace_max_file_bytes` are 413. Rules in `orchestrator.workspace`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import Ctx, CurrentUser
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


class ErrorOut(BaseModel):
    """The error body of every workspace endpoint."""

    ok: bool = False
    error: str = Field(description="What went wrong; `multiple matches` for an ambiguous edit")
    code: str = Field(
        description="unsafe_path, validation_error, bad_request, no_match, multiple_matches, "
        "not_found, payload_too_large"
    )
    request_id: str | None = None
    matches: int | None = Field(None, description="edit: occurrences of old_text (0, or > 1)")
    size: int | None = Field(None, description="413: the file's size in bytes")
    limit: int | None = Field(None, description="413: workspace_max_file_bytes")


ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorOut, "description": "Unsafe path, bad input, no match, multiple matches"},
    404: {"model": ErrorOut, "description": "No such file or directory"},
    413: {"model": ErrorOut, "description": "Over workspace_max_file_bytes"},
}


class ReadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText


class ReadOut(BaseModel):
    path: str
    content: str = Field(description="The text, or base64 of the bytes (see `encoding`)")
    size: int = Field(description="Bytes on disk")
    encoding: Literal["utf-8", "base64"] = Field(
        description="utf-8 for text; base64 for a file that is not valid UTF-8"
    )


class WriteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText
    content: str
    encoding: Literal["utf-8", "base64"] = Field(
        "utf-8", description="base64: `content` holds the file's bytes in base64"
    )


class WriteOut(BaseModel):
    ok: bool = True
    path: str
    size: int
    created: bool = Field(description="False when an existing file was replaced")


class EditBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: PathText
    old_text: str = Field(min_length=1, description="Must occur exactly once")
    new_text: str


class EditOut(BaseModel):
    ok: bool = True
    path: str
    size: int
    replacements: int = 1


class SearchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=PATH_FIELD_MAX,
        description="Glob relative to the root: `*`, `?`, `[..]` within a name; `**` any "
        "number of directories (`**/*.py`)",
    )
    max_results: int = Field(100, ge=1, le=MAX_SEARCH_RESULTS)


class SearchHit(BaseModel):
    path: str
    size: int
    modified: str = Field(description="ISO 8601 UTC")


class SearchOut(BaseModel):
    results: list[SearchHit]
    count: int
    truncated: bool = Field(description="More files matched than are shown")


class EntryOut(BaseModel):
    path: str = Field(description="Relative to the workspace root")
    type: Literal["file", "directory"]
    size: int = Field(description="Bytes; 0 for a directory")
    modified: str = Field(description="ISO 8601 UTC")


class ListOut(BaseModel):
    path: str = Field(description="The directory listed ('' for the root)")
    entries: list[EntryOut]
    count: int
    truncated: bool = Field(description="The listing stopped at its limit (10 000 entries)")


def _entry(info: FileInfo) -> EntryOut:
    return EntryOut(path=info.path, type=info.type, size=info.size, modified=info.modified)


@router.post("/workspace/read", response_model=ReadOut, responses=ERRORS)
async def read(body: ReadBody, ctx: Ctx, caller: CurrentUser) -> ReadOut:
    """A file's content: text as is, anything that is not UTF-8 as base64."""
    found = await ctx.workspace.read(caller.user_uuid, body.path)
    return ReadOut(path=found.path, content=found.content, size=found.size, encoding=found.encoding)


@router.post("/workspace/write", response_model=WriteOut, responses=ERRORS)
async def write(body: WriteBody, ctx: Ctx, caller: CurrentUser) -> WriteOut:
    """Create or replace a file atomically (temp file, fsync, rename), making missing
    parent directories."""
    done = await ctx.workspace.write(caller.user_uuid, body.path, body.content, body.encoding)
    return WriteOut(path=done.path, size=done.size, created=done.created)


@router.post("/workspace/edit", response_model=EditOut, responses=ERRORS)
async def edit(body: EditBody, ctx: Ctx, caller: CurrentUser) -> EditOut:
    """Replace the one exact occurrence of `old_text`. Several: 400
    `{error: 'multiple matches', matches}`; none: 400 `no_match`; the file is unchanged."""
    done = await ctx.workspace.edit(caller.user_uuid, body.path, body.old_text, body.new_text)
    return EditOut(path=done.path, size=done.size)


@router.post("/workspace/search", response_model=SearchOut, responses=ERRORS)
async def search(body: SearchBody, ctx: Ctx, caller: CurrentUser) -> SearchOut:
    """Files matching the glob, sorted by path, at most `max_results`."""
    found = await ctx.workspace.search(caller.user_uuid, body.query, body.max_results)
    hits = [SearchHit(path=f.path, size=f.size, modified=f.modified) for f in found.results]
    return SearchOut(results=hits, count=len(hits), truncated=found.truncated)


@router.get("/workspace/list", response_model=ListOut, responses=ERRORS)
async def list_entries(
    ctx: Ctx,
    caller: CurrentUser,
    path: Annotated[str, Query(max_length=PATH_FIELD_MAX, description="Directory ('' root)")] = "",
    recursive: bool = False,
) -> ListOut:
    """A directory's files and directories (the whole tree with `recursive`), sorted by
    path; links whose target is outside the root are left out."""
    listing = await ctx.workspace.list_dir(caller.user_uuid, path, recursive)
    entries = [_entry(e) for e in listing.entries]
    return ListOut(
        path=listing.path, entries=entries, count=len(entries), truncated=listing.truncated
    )
