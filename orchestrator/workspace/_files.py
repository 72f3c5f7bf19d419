"""Workspace files: read, write (atomic), edit (exact match), search (glob) and list, inside
the caller's root `<workspace_root>/<user>/` (the root itself when isolation is `shared`).

Safety, beyond the text checks of `_paths`:
- a path is resolved (symbolic links followed) and must stay inside the caller's root;
- the resolved path is then opened one segment at a time from a descriptor of that root with
  O_NOFOLLOW (openat), and the directory reached is checked once more where the platform
  says where a descriptor points (/proc/self/fd): a link swapped in after the check is refused,
  never followed;
- list and search report a symbolic link only when its target is inside the root (as the
  target's type, size and time) and never descend into a linked directory;
- a write goes to a temp file in the target's directory: write, fsync, rename over the target,
  fsync the directory. A reader sees the old file or the new one, never a torn one;
- writes and edits of one file are serialised by an asyncio lock per path in this process and
  by `flock` on the parent directory across processes (API replicas and agent workers share
  the root), so an edit's read-modify-write never loses a concurrent update.

Blocking file I/O runs in threads (`asyncio.to_thread`); nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from orchestrator.config import Settings
from orchestrator.errors import (
    BadRequest,
    ErrorCode,
    InternalError,
    NotFound,
    PayloadTooLarge,
    ValidationFailed,
)
from orchestrator.workspace._paths import (
    TMP_PREFIX,
    UnsafePath,
    count_matches,
    file_parts,
    glob_parts,
    iso_utc,
    split_path,
    user_dir_name,
)

__all__ = [
    "MAX_LIST_ENTRIES",
    "MAX_SCANNED_ENTRIES",
    "MAX_SEARCH_RESULTS",
    "Edited",
    "FileContent",
    "FileInfo",
    "Found",
    "Listing",
    "Workspace",
    "Written",
]

MAX_LIST_ENTRIES = 10_000  # one listing; `truncated` says when there were more
MAX_SEARCH_RESULTS = 10_000  # the largest max_results honoured
MAX_SCANNED_ENTRIES = 200_000  # directory entries one search may look at

Encoding = Literal["utf-8", "base64"]
EntryType = Literal["file", "directory"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO can't hang us
_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A list or search entry; `path` is relative to the caller's root, `modified` ISO 8601
    UTC. A directory's `size` is 0."""

    path: str
    type: EntryType
    size: int
    modified: str

    def wire(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.type, "size": self.size, "modified": self.modified}


@dataclass(frozen=True, slots=True)
class FileContent:
    """`content` is the text when the file is UTF-8 (`encoding` "utf-8"), else its bytes in
    base64 (`encoding` "base64"); `size` is the file's size in bytes either way."""

    path: str
    content: str
    size: int
    encoding: Encoding


@dataclass(frozen=True, slots=True)
class Written:
    path: str
    size: int
    created: bool


@dataclass(frozen=True, slots=True)
class Edited:
    path: str
    size: int


@dataclass(frozen=True, slots=True)
class Found:
    results: tuple[FileInfo, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class Listing:
    path: str
    entries: tuple[FileInfo, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class _Home:
    """The caller's root: an open descriptor and its real path."""

    fd: int
    real: str

    def inside(self, real: str) -> bool:
        return real == self.real or real.startswith(self.real.rstrip(os.sep) + os.sep)


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    type: EntryType
    size: int
    mtime: float
    linked: bool  # a symbolic link (whose target is inside the root): never descended


class _PathLocks:
    """One asyncio lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        held = self._locks.get(key)
        lock, users = held if held is not None else (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Workspace:
    """File operations of each user inside the configured root (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.root: Path = settings.resolved_workspace_root
        self.shared = settings.workspace_isolation == "shared"
        self.max_file_bytes = settings.workspace_max_file_bytes
        self._locks = _PathLocks()

    def __repr__(self) -> str:
        mode = "shared" if self.shared else "per-user"
        return f"Workspace(root={str(self.root)!r}, {mode}, max_file_bytes={self.max_file_bytes})"

    # --- the operations --------------------------------------------------------------------

    async def read(self, user_uuid: str, path: str) -> FileContent:
        parts = file_parts(path)
        return await asyncio.to_thread(self._read, user_uuid, parts)

    async def write(
        self, user_uuid: str, path: str, content: str, encoding: Encoding = "utf-8"
    ) -> Written:
        """Create or replace the file (and its missing parent directories), atomically."""
        parts = file_parts(path)
        async with self._locks.hold(self._lock_key(user_uuid, parts)):
            return await asyncio.to_thread(self._write, user_uuid, parts, content, encoding)

    async def edit(self, user_uuid: str, path: str, old_text: str, new_text: str) -> Edited:
        """Replace the one occurrence of `old_text`; none or several: 400 (`no_match`,
        `multiple_matches` with `matches`), the file unchanged."""
        parts = file_parts(path)
        if not old_text:
            raise ValidationFailed(
                "old_text must not be empty",
                extra={"fields": [{"field": "old_text", "message": "must not be empty"}]},
            )
        async with self._locks.hold(self._lock_key(user_uuid, parts)):
            return await asyncio.to_thread(self._edit, user_uuid, parts, old_text, new_text)

    async def search(self, user_uuid: str, query: str, max_results: int) -> Found:
        """Files whose path relative to the caller's root matches the glob `query`; at most
        `max_results`, sorted by path."""
        segments = glob_parts(query)
        if max_results < 1:
            raise ValidationFailed(
                "max_results must be at least 1",
                extra={"fields": [{"field": "max_results", "message": "at least 1"}]},
            )
        limit = min(max_results, MAX_SEARCH_RESULTS)
        return await asyncio.to_thread(self._search, user_uuid, segments, limit)

    async def list_dir(self, user_uuid: str, path: str = "", recursive: bool = False) -> Listing:
        """Entries of a directory (`""`: the caller's root), or of its whole tree."""
        parts = split_path(path)
        return await asyncio.to_thread(self._list, user_uuid, parts, recursive)

    # --- checks shared by the operations ---------------------------------------------------

    def _lock_key(self, user_uuid: str, parts: tuple[str, ...]) -> str:
        home = "" if self.shared else user_dir_name(user_uuid)
        return home + "\x00" + "/".join(parts)

    def _check_size(self, size: int, shown: str) -> None:
        if size > self.max_file_bytes:
            raise PayloadTooLarge(
                f"{shown!r} would be {size} bytes; the workspace limit is "
                f"{self.max_file_bytes} bytes (workspace_max_file_bytes)",
                extra={"size": size, "limit": self.max_file_bytes},
            )

    def _encode(self, content: str, encoding: Encoding, shown: str) -> bytes:
        if encoding == "base64":
            packed = _WHITESPACE.sub("", content)
            # Decoding is cheap, but not decoding a huge body at all is cheaper.
            self._check_size(len(packed) // 4 * 3 - 2, shown)
            try:
                data = base64.b64decode(packed, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValidationFailed(
                    "content is not valid base64",
                    extra={"fields": [{"field": "content", "message": "not base64"}]},
                ) from exc
        else:
            self._check_size(len(content), shown)  # UTF-8 has at least a byte per character
            try:
                data = content.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValidationFailed(
                    "content is not valid Unicode text (a lone surrogate)",
                    extra={"fields": [{"field": "content", "message": "not encodable"}]},
                ) from exc
        self._check_size(len(data), shown)
        return data

    @contextlib.contextmanager
    def _home(self, user_uuid: str) -> Iterator[_Home]:
        os.makedirs(self.root, exist_ok=True)
        root_real = os.path.realpath(self.root)
        root_fd = os.open(root_real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if self.shared:
            try:
                yield _Home(root_fd, root_real)
            finally:
                os.close(root_fd)
            return
        name = user_dir_name(user_uuid)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=root_fd)
            try:
                fd = os.open(name, _DIR, dir_fd=root_fd)
            except NotADirectoryError as exc:
                # Someone put a file or a link there: a misconfigured root, not the caller's fault.
                raise InternalError("a user's workspace is not a plain directory") from exc
        finally:
            os.close(root_fd)
        try:
            yield _Home(fd, os.path.join(root_real, name))
        finally:
            os.close(fd)

    @staticmethod
    def _resolve(home: _Home, parts: tuple[str, ...], shown: str) -> tuple[str, ...]:
        """The path with every symbolic link resolved, as segments under the caller's root."""
        real = os.path.realpath(os.path.join(home.real, *parts))
        if not home.inside(real):
            raise UnsafePath(f"{shown!r} leads outside the workspace (through a symbolic link)")
        if real == home.real:
            return ()
        return tuple(real[len(home.real.rstrip(os.sep)) + 1 :].split(os.sep))

    @staticmethod
    def _check_fd(home: _Home, fd: int, shown: str) -> None:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return  # no /proc here: the O_NOFOLLOW walk stands on its own
        if not home.inside(where.removesuffix(" (deleted)")):
            raise UnsafePath(f"{shown!r} changed while in use and now leads outside the workspace")

    def _open_dir(self, home: _Home, parts: tuple[str, ...], shown: str, create: bool) -> int:
        """A descriptor of the directory `parts` (already resolved), reached from the root one
        segment at a time without following links; `create` makes the missing ones."""
        current = os.dup(home.fd)
        try:
            for i, part in enumerate(parts):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=current)
                try:
                    step = os.open(part, _DIR, dir_fd=current)
                except FileNotFoundError:
                    raise NotFound(f"no such directory: {'/'.join(parts[: i + 1])!r}") from None
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    if _is_link(current, part):
                        raise UnsafePath(
                            f"{shown!r} changed while in use (a link appeared)"
                        ) from None
                    raise BadRequest(
                        f"{'/'.join(parts[: i + 1])!r} is not a directory (in {shown!r})"
                    ) from None
                os.close(current)
                current = step
            self._check_fd(home, current, shown)
            return current
        except BaseException:
            os.close(current)
            raise

    def _read_at(self, dir_fd: int, name: str, shown: str) -> bytes:
        try:
            fd = os.open(name, _READ, dir_fd=dir_fd)
        except FileNotFoundError:
            raise NotFound(f"no such file: {shown!r}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(f"{shown!r} changed while in use (a link appeared)") from None
            raise
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise BadRequest(f"{shown!r} is a directory (list it instead)")
            if not stat.S_ISREG(info.st_mode):
                raise BadRequest(f"{shown!r} is not a regular file")
            self._check_size(info.st_size, shown)
            chunks: list[bytes] = []
            total = 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                total += len(chunk)
                self._check_size(total, shown)  # it grew while we read
            return b"".join(chunks)
        finally:
            os.close(fd)

    @staticmethod
    def _replace_at(dir_fd: int, name: str, data: bytes, shown: str) -> bool:
        """Write `data` to `name` in `dir_fd` atomically; True when the file is new."""
        try:
            before: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            before = None
        if before is not None and stat.S_ISDIR(before.st_mode):
            raise BadRequest(f"{shown!r} is a directory")
        if before is not None and stat.S_ISLNK(before.st_mode):
            # Resolution followed every link that leads somewhere: this one loops, or appeared
            # after the check. It is neither written through nor replaced.
            raise UnsafePath(f"{shown!r} is a symbolic link that cannot be resolved safely")
        if before is not None and not stat.S_ISREG(before.st_mode):
            raise BadRequest(f"{shown!r} is not a regular file")
        temp = TMP_PREFIX + secrets.token_hex(8)
        fd = os.open(temp, _TEMP, 0o644, dir_fd=dir_fd)
        try:
            try:
                if before is not None:
                    os.fchmod(fd, stat.S_IMODE(before.st_mode))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)  # the rename itself survives a crash
        return before is None

    # --- the operations, in a worker thread ------------------------------------------------

    def _read(self, user_uuid: str, parts: tuple[str, ...]) -> FileContent:
        shown = "/".join(parts)
        with self._home(user_uuid) as home:
            real = self._resolve(home, parts, shown)
            if not real:
                raise BadRequest(f"{shown!r} is a directory (list it instead)")
            dir_fd = self._open_dir(home, real[:-1], shown, create=False)
            try:
                data = self._read_at(dir_fd, real[-1], shown)
            finally:
                os.close(dir_fd)
        try:
            return FileContent(shown, data.decode("utf-8"), len(data), "utf-8")
        except UnicodeDecodeError:
            return FileContent(shown, base64.b64encode(data).decode("ascii"), len(data), "base64")

    def _write(
        self, user_uuid: str, parts: tuple[str, ...], content: str, encoding: Encoding
    ) -> Written:
        shown = "/".join(parts)
        data = self._encode(content, encoding, shown)  # megabytes of base64: not on the loop
        with self._home(user_uuid) as home:
            real = self._resolve(home, parts, shown)
            if not real:
                raise BadRequest(f"{shown!r} is a directory")
            dir_fd = self._open_dir(home, real[:-1], shown, create=True)
            try:
                _lock_exclusive(dir_fd)
                created = self._replace_at(dir_fd, real[-1], data, shown)
            finally:
                os.close(dir_fd)  # releases the flock
        return Written(shown, len(data), created)

    def _edit(self, user_uuid: str, parts: tuple[str, ...], old: str, new: str) -> Edited:
        shown = "/".join(parts)
        with self._home(user_uuid) as home:
            real = self._resolve(home, parts, shown)
            if not real:
                raise BadRequest(f"{shown!r} is a directory")
            dir_fd = self._open_dir(home, real[:-1], shown, create=False)
            try:
                _lock_exclusive(dir_fd)
                try:
                    text = self._read_at(dir_fd, real[-1], shown).decode("utf-8")
                except UnicodeDecodeError:
                    raise BadRequest(
                        f"{shown!r} is not UTF-8 text; edit changes text files (write replaces "
                        "any file)"
                    ) from None
                matches = count_matches(text, old)
                if matches == 0:
                    raise BadRequest(
                        f"old_text was not found in {shown!r} (it must match exactly, "
                        "whitespace included)",
                        code=ErrorCode.NO_MATCH,
                        extra={"matches": 0},
                    )
                if matches > 1:
                    raise BadRequest(
                        "multiple matches",
                        code=ErrorCode.MULTIPLE_MATCHES,
                        extra={"matches": matches},
                    )
                data = text.replace(old, new, 1).encode("utf-8")
                self._check_size(len(data), shown)
                self._replace_at(dir_fd, real[-1], data, shown)
            finally:
                os.close(dir_fd)
        return Edited(shown, len(data))

    def _scan(self, home: _Home, rel: tuple[str, ...]) -> list[_Entry] | None:
        """The directory's entries by name, links to outside (or nowhere) and temp files
        left out; None when it cannot be opened (gone, or replaced by a link)."""
        try:
            dir_fd = self._open_dir(home, rel, "/".join(rel), create=False)
        except (BadRequest, NotFound, OSError):
            return None
        try:
            with os.scandir(dir_fd) as listing:
                found = sorted(listing, key=lambda e: e.name)
            out: list[_Entry] = []
            for item in found:
                if item.name.startswith(TMP_PREFIX):
                    continue
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                linked = stat.S_ISLNK(info.st_mode)
                if linked:
                    target = os.path.realpath(os.path.join(home.real, *rel, item.name))
                    if not home.inside(target):
                        continue
                    try:
                        info = os.stat(target)
                    except OSError:
                        continue
                if stat.S_ISREG(info.st_mode):
                    out.append(_Entry(item.name, "file", info.st_size, info.st_mtime, linked))
                elif stat.S_ISDIR(info.st_mode):
                    out.append(_Entry(item.name, "directory", 0, info.st_mtime, linked))
            return out
        finally:
            os.close(dir_fd)

    def _search(self, user_uuid: str, segments: tuple[str, ...], limit: int) -> Found:
        last = len(segments) - 1
        hits: list[FileInfo] = []
        scanned = 0
        with self._home(user_uuid) as home:
            # Depth-first over directories, each carrying the set of pattern positions it
            # may continue from (a small NFA): every directory is read at most once.
            stack: list[tuple[tuple[str, ...], frozenset[int]]] = [((), frozenset({0}))]
            while stack:
                rel, states = stack.pop()
                closure = set(states)
                for i in sorted(states):
                    while i < last and segments[i] == "**":  # '**' may match no directory
                        i += 1
                        closure.add(i)
                entries = self._scan(home, rel)
                if entries is None:
                    continue
                scanned += len(entries)
                if scanned > MAX_SCANNED_ENTRIES:
                    return Found(tuple(sorted(hits, key=_by_path)[:limit]), True)
                below: list[tuple[tuple[str, ...], frozenset[int]]] = []
                for entry in entries:
                    hit, nxt = False, set()
                    for i in closure:
                        if segments[i] == "**":
                            hit = hit or i == last
                            nxt.add(i)
                        elif fnmatchcase(entry.name, segments[i]):
                            hit = hit or i == last
                            if i < last:
                                nxt.add(i + 1)
                    path = "/".join((*rel, entry.name))
                    if hit and entry.type == "file":
                        hits.append(FileInfo(path, "file", entry.size, iso_utc(entry.mtime)))
                        if len(hits) > limit:
                            return Found(tuple(sorted(hits, key=_by_path)[:limit]), True)
                    if nxt and entry.type == "directory" and not entry.linked:
                        below.append(((*rel, entry.name), frozenset(nxt)))
                stack.extend(reversed(below))
        return Found(tuple(sorted(hits, key=_by_path)), False)

    def _list(self, user_uuid: str, parts: tuple[str, ...], recursive: bool) -> Listing:
        shown = "/".join(parts)
        entries: list[FileInfo] = []
        with self._home(user_uuid) as home:
            real = self._resolve(home, parts, shown)
            os.close(self._open_dir(home, real, shown or ".", create=False))  # 404 / 400 here
            stack: list[tuple[tuple[str, ...], tuple[str, ...]]] = [(real, parts)]
            while stack:
                real_dir, shown_dir = stack.pop()
                below = []
                for entry in self._scan(home, real_dir) or ():
                    if len(entries) == MAX_LIST_ENTRIES:
                        return Listing(shown, tuple(sorted(entries, key=_by_path)), True)
                    path = "/".join((*shown_dir, entry.name))
                    entries.append(FileInfo(path, entry.type, entry.size, iso_utc(entry.mtime)))
                    if recursive and entry.type == "directory" and not entry.linked:
                        below.append(((*real_dir, entry.name), (*shown_dir, entry.name)))
                stack.extend(reversed(below))
        return Listing(shown, tuple(sorted(entries, key=_by_path)), False)


def _by_path(info: FileInfo) -> str:
    return info.path


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _lock_exclusive(dir_fd: int) -> None:
    """flock the directory: writers in other processes (API replicas, agent workers) wait.
    Best effort: a filesystem without flock on directories (some network ones) goes without,
    and writes stay atomic there, only concurrent edits across processes are not serialised."""
    with contextlib.suppress(OSError):
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
