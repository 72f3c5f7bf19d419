"""Workspace files (SPEC part 4, workspace): the answers, and the error body every
workspace route documents."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.wire._base import ApiModel

__all__ = [
    "DirectoryEntry",
    "DirectoryListing",
    "Encoding",
    "FileContent",
    "FileEdited",
    "FileHit",
    "FileSearch",
    "FileWritten",
    "WorkspaceError",
]

Encoding = Literal["utf-8", "base64"]


class FileContent(ApiModel):
    path: str
    content: str = Field(description="The text, or base64 of the bytes (see `encoding`)")
    size: int = Field(description="Bytes on disk")
    encoding: Encoding = Field(
        description="utf-8 for text; base64 for a file that is not valid UTF-8"
    )


class FileWritten(ApiModel):
    ok: bool = True
    path: str
    size: int
    created: bool = Field(description="False when an existing file was replaced")


class FileEdited(ApiModel):
    ok: bool = True
    path: str
    size: int
    replacements: int = 1


class FileHit(ApiModel):
    path: str
    size: int
    modified: str = Field(description="ISO 8601 UTC")


class FileSearch(ApiModel):
    results: list[FileHit]
    count: int
    truncated: bool = Field(description="More files matched than are shown")


class DirectoryEntry(ApiModel):
    path: str = Field(description="Relative to the workspace root")
    type: Literal["file", "directory"]
    size: int = Field(description="Bytes; 0 for a directory")
    modified: str = Field(description="ISO 8601 UTC")


class DirectoryListing(ApiModel):
    path: str = Field(description="The directory listed ('' for the root)")
    entries: list[DirectoryEntry]
    count: int
    truncated: bool = Field(description="The listing stopped at its limit (10 000 entries)")


class WorkspaceError(ApiModel):
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
