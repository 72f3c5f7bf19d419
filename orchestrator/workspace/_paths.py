"""What a caller may name in a workspace, checked before any file is touched (pure functions).

A path is relative to the caller's workspace root, `/`-separated. Rejected (400, code
`unsafe_path`): `..` segments, absolute paths, NUL and other control characters, backslashes,
segments over 255 bytes, paths over 1024 bytes, the reserved temp-file prefix, and any path
that percent-decodes (at any depth) into one of those, so a proxy or client that decodes later
cannot turn an accepted path into a traversal. Symbolic links are checked where the files are
(`_files.py`): these checks only see text.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from urllib.parse import unquote

from orchestrator.errors import BadRequest, ErrorCode

__all__ = [
    "MAX_PATH_BYTES",
    "MAX_SEGMENT_BYTES",
    "TMP_PREFIX",
    "UnsafePath",
    "count_matches",
    "file_parts",
    "glob_parts",
    "iso_utc",
    "split_path",
    "user_dir_name",
]

MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255  # NAME_MAX of the common Linux filesystems
MAX_DECODE_DEPTH = 4
# Atomic writes go through `<dir>/.ws-tmp-<random>`; the prefix is reserved, so a caller never
# names (or sees) a write in flight or one a crash left behind.
TMP_PREFIX = ".ws-tmp-"
# A user id that is already a safe directory name (every id `POST /tokens` accepts) is used as
# is; any other (a JWT subject such as `auth0|123` or `../x`) by a hash of it, under a `~`
# prefix those ids cannot start with, so the two forms never collide.
_SAFE_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:\-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_GLOB_MAGIC = re.compile(r"[*?\[]")


class UnsafePath(BadRequest):
    """A path that could leave the caller's workspace, or that the workspace refuses to name."""

    default_code = ErrorCode.UNSAFE_PATH


def user_dir_name(user_uuid: str) -> str:
    if _SAFE_USER.fullmatch(user_uuid):
        return user_uuid
    return "~" + hashlib.sha256(user_uuid.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _check_text(text: str, what: str, shown: str) -> None:
    if "\x00" in text:
        raise UnsafePath(f"{what} contains a NUL byte")
    if _CONTROL.search(text):
        raise UnsafePath(f"{what} contains a control character")
    if "\\" in text:
        # A legal file-name character on POSIX, but a separator to Windows clients and to
        # path-joining code on their side: `..\\..\\x` must not mean two things.
        raise UnsafePath(f"{what} contains a backslash; use '/' to separate segments")
    if text.startswith("/"):
        raise UnsafePath(f"{what} must be relative to the workspace root: {shown!r}")
    if any(segment == ".." for segment in text.split("/")):
        raise UnsafePath(f"{what} must not contain '..' segments: {shown!r}")


def _shown(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."


def _check(text: str, what: str) -> tuple[str, ...]:
    if not isinstance(text, str):
        raise UnsafePath(f"{what} must be a string")
    shown = _shown(text)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath(f"{what} is longer than {MAX_PATH_BYTES} bytes")
    _check_text(text, what, shown)
    layer = text
    for _ in range(MAX_DECODE_DEPTH):
        decoded = unquote(layer)
        if decoded == layer:
            break
        try:
            _check_text(decoded, what, shown)
        except UnsafePath as exc:
            raise UnsafePath(f"{exc.message} (once percent-decoded)") from None
        layer = decoded
    segments = tuple(s for s in text.split("/") if s not in ("", "."))
    for segment in segments:
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise UnsafePath(f"{what}: a segment is longer than {MAX_SEGMENT_BYTES} bytes")
        if segment.startswith(TMP_PREFIX):
            raise UnsafePath(f"{what}: names starting with {TMP_PREFIX!r} are reserved")
    return segments


def split_path(path: str) -> tuple[str, ...]:
    """The segments of a caller's path; `""`, `"."` and `"/"`-free variants of the root are
    `()`. Empty and `.` segments are dropped (`a//./b` is `a/b`)."""
    return _check(path, "path")


def file_parts(path: str) -> tuple[str, ...]:
    """Like `split_path`, for an operation on one file: the root or a trailing `/` is a 400."""
    parts = split_path(path)
    if not parts or path.endswith("/"):
        raise BadRequest(f"path must name a file: {_shown(path)!r}")
    return parts


def glob_parts(query: str) -> tuple[str, ...]:
    """The segments of a search glob: `*`, `?` and `[...]` within a segment, `**` as a whole
    segment for any number of directories (zero included). The same safety rules as paths."""
    parts = _check(query, "query")
    if not parts:
        raise BadRequest("query: an empty glob matches nothing; use '**' for every file")
    for segment in parts:
        if "**" in segment and segment != "**":
            raise BadRequest(f"query: '**' must be a whole segment (as in 'a/**/b'): {segment!r}")
    return parts


def has_magic(segment: str) -> bool:
    return _GLOB_MAGIC.search(segment) is not None


def count_matches(text: str, old: str) -> int:
    """Occurrences of `old` in `text`, counted without overlap; when that count is 1 but a
    second occurrence overlaps the first (`aa` in `aaa`), the overlapping count: either way
    the replacement would be ambiguous."""
    count = text.count(old)
    if count != 1:
        return count
    first = text.find(old)
    overlapping, at = 1, text.find(old, first + 1)
    while at != -1:  # overlaps start within len(old) of each other: a short loop
        overlapping += 1
        at = text.find(old, at + 1)
    return overlapping


def iso_utc(mtime: float) -> str:
    """ISO 8601 in UTC with milliseconds and a `Z`: `2024-05-01T12:00:00.123Z`."""
    when = dt.datetime.fromtimestamp(mtime, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
