"""The asyncpg pool every process uses, and what the service knows about its database."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg

from orchestrator.db._migrations import apply_migrations, migration_lock

log = logging.getLogger(__name__)


@dataclass
class Database:
    """A pool plus facts learnt at connect time (pgvector availability, the migrations this
    connect applied)."""

    pool: asyncpg.Pool
    pgvector: bool
    migrations_applied: list[str] = field(default_factory=list)

    async def ping(self, timeout_s: float = 2.0) -> int:
        """Probe the server; return the number of tables in the public schema."""
        async with asyncio.timeout(timeout_s):
            async with self.pool.acquire() as conn:
                return int(
                    await conn.fetchval(
                        "SELECT count(*) FROM information_schema.tables"
                        " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
                    )
                )

    async def close(self) -> None:
        await self.pool.close()


async def _enable_pgvector(conn: asyncpg.Connection) -> bool:
    available = await conn.fetchval(
        "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
    )
    if not available:
        log.warning("pgvector is not available on this server: vector search is off")
        return False
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except asyncpg.PostgresError as exc:
        log.warning("cannot enable pgvector (%s): vector search is off", exc)
        return False
    return True


async def _reset_on_release(conn: asyncpg.Connection) -> None:
    """Replaces asyncpg's default reset (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`), a round trip on every release that measured as a third of a small query's
    cost. Pool connections never carry session state here: locks are transaction-scoped,
    LISTEN and the migration lock use connections of their own, and nothing runs SET
    outside a transaction (SET LOCAL only)."""
    if conn.is_in_transaction():  # a transaction left open by a cancelled caller
        await conn.execute("ROLLBACK")


async def connect(
    dsn: str, *, min_size: int = 1, max_size: int = 10, migrate: bool = True
) -> Database:
    """Open the pool; enable pgvector where available; apply pending migrations."""
    async with asyncio.timeout(30):
        conn = await asyncpg.connect(dsn)
    try:
        # Under the migration lock: replicas starting together must not race on CREATE
        # EXTENSION (a unique violation would read as "pgvector off").
        async with migration_lock(conn):
            pgvector = await _enable_pgvector(conn)
            applied = await apply_migrations(conn) if migrate else []
            await conn.execute(
                """INSERT INTO service_facts (key, value) VALUES ('pgvector', $1)
                   ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value""",
                "on" if pgvector else "off",
            )
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        max_inactive_connection_lifetime=60,
        timeout=10,  # connecting
        command_timeout=30,  # any one statement: a hung server must not hang requests forever
        reset=_reset_on_release,
    )
    assert pool is not None
    return Database(pool=pool, pgvector=pgvector, migrations_applied=applied)
