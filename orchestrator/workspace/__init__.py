"""Workspace: each user's files under the configured root, with path safety, atomic writes,
exact-match edits, glob search and listing; agent tools over the same."""

from orchestrator.workspace._files import (
    MAX_LIST_ENTRIES,
    MAX_SEARCH_RESULTS,
    Edited,
    FileContent,
    FileInfo,
    Found,
    Listing,
    Workspace,
    Written,
)
from orchestrator.workspace._paths import (
    MAX_PATH_BYTES,
    MAX_SEGMENT_BYTES,
    UnsafePath,
)
from orchestrator.workspace._tools import WORKSPACE_TOOLS

__all__ = [
    "MAX_LIST_ENTRIES",
    "MAX_PATH_BYTES",
    "MAX_SEARCH_RESULTS",
    "MAX_SEGMENT_BYTES",
    "WORKSPACE_TOOLS",
    "Edited",
    "FileContent",
    "FileInfo",
    "Found",
    "Listing",
    "UnsafePath",
    "Workspace",
    "Written",
]
