"""Numbered SQL migrations, applied at start in order, each in its own transaction.

Each applied migration's sha256 is recorded; a start that finds an applied migration's file
changed refuses to go on (`MigrationChanged`): the database was built from other SQL than
the repository now holds, and nothing would ever apply the difference.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any constant works; it serialises concurrent starters (several replicas, the CLI).
_LOCK_KEY = 0x0C4E57A7


class MigrationChanged(RuntimeError):
    """An applied migration's file differs from what was applied."""

    def __init__(self, names: list[str], directory: Path) -> None:
        self.names = names
        files = ", ".join(str(directory / n) for n in names)
        super().__init__(
            f"applied migration file(s) changed since they were applied: {files}. "
            "Restore the file(s) as applied and put the change in a new numbered migration."
        )


def checksum(path: Path) -> str:
    """sha256 of the file's bytes, as `sha256sum` prints it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file name must be NNNN_name.sql: {path.name}")
        found.append((int(match.group(1)), path.name, path.read_text()))
    versions = [v for v, _, _ in found]
    if len(versions) != len(set(versions)):
        raise ValueError("two migrations share a number")
    return found


@asynccontextmanager
async def migration_lock(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """A session-level advisory lock (re-entrant: a session may hold it more than once)."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        yield
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def _verify_applied(
    conn: asyncpg.Connection, found: list[tuple[int, str, str]], directory: Path
) -> set[int]:
    """Compare applied migrations with their files; return the applied versions. Rows from
    before checksums existed (NULL) get the file's checksum, once."""
    files = {version: name for version, name, _sql in found}
    rows = await conn.fetch("SELECT version, name, checksum FROM schema_migrations")
    changed: list[str] = []
    for row in rows:
        name = files.get(row["version"])
        if name is None:
            # A file removed after it was applied: nothing to compare it with.
            log.warning("applied migration %s has no file in %s", row["name"], directory)
            continue
        digest = checksum(directory / name)
        if row["checksum"] is None:
            await conn.execute(
                "UPDATE schema_migrations SET checksum = $2"
                " WHERE version = $1 AND checksum IS NULL",
                row["version"],
                digest,
            )
        elif row["checksum"] != digest:
            changed.append(name)
    if changed:
        raise MigrationChanged(changed, directory)
    return {r["version"] for r in rows}


async def apply_migrations(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied now. Raises
    `MigrationChanged` (before applying anything) when an applied file was edited."""
    async with migration_lock(conn):
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at bigint NOT NULL
                       DEFAULT (extract(epoch from clock_timestamp()) * 1000)::bigint,
                   checksum text)"""
        )
        # Databases from before checksums: the column is added here, not by a numbered
        # migration, since the check must run before any migration does.
        await conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text")
        found = discover(directory)
        done = await _verify_applied(conn, found, directory)
        applied: list[str] = []
        for version, name, sql in found:
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    version,
                    name,
                    checksum(directory / name),
                )
            log.info("applied migration %s", name)
            applied.append(name)
        return applied
