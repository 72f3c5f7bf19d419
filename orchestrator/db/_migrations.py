"""Numbered SQL migrations, applied at start in order, each in its own transaction."""

from __future__ import annotations

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


async def apply_migrations(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied now."""
    async with migration_lock(conn):
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at bigint NOT NULL
                       DEFAULT (extract(epoch from clock_timestamp()) * 1000)::bigint)"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        applied: list[str] = []
        for version, name, sql in discover(directory):
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
            log.info("applied migration %s", name)
            applied.append(name)
        return applied
