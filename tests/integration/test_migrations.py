import hashlib

import asyncpg
import pytest

from orchestrator.db import MIGRATIONS_DIR, MigrationChanged, apply_migrations, connect


async def test_migrations_apply_once_and_are_recorded(empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        first = await apply_migrations(conn)
        files = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
        assert first == files
        second = await apply_migrations(conn)
        assert second == []
        rows = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [r["name"] for r in rows] == files
        tables = {
            r["table_name"]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        assert {"api_tokens", "service_heartbeats", "service_facts", "schema_migrations"} <= tables
    finally:
        await conn.close()


async def test_connect_enables_pgvector_and_records_it(empty_database_url: str) -> None:
    db = await connect(empty_database_url)
    try:
        assert db.pgvector is True
        fact = "SELECT value FROM service_facts WHERE key = 'pgvector'"
        assert await db.pool.fetchval(fact) == "on"
        assert await db.pool.fetchval("SELECT '[1,2,3]'::vector <=> '[1,2,3]'::vector") == 0
        assert await db.ping() >= 4
    finally:
        await db.close()
    # A second start against the same database is a no-op for migrations.
    db = await connect(empty_database_url)
    await db.close()


async def test_a_failing_migration_leaves_nothing_behind(empty_database_url: str, tmp_path) -> None:
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE good (id int);")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE half (id int); SELECT no_such_fn();")
    conn = await asyncpg.connect(empty_database_url)
    try:
        try:
            await apply_migrations(conn, tmp_path)
        except asyncpg.PostgresError:
            pass
        else:
            raise AssertionError("the bad migration should have failed")
        names = [r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")]
        assert names == ["0001_ok.sql"]
        assert await conn.fetchval("SELECT to_regclass('half')") is None
    finally:
        await conn.close()


async def test_an_edited_migration_is_refused_before_anything_is_applied(
    empty_database_url: str, tmp_path
) -> None:
    (tmp_path / "0001_one.sql").write_text("CREATE TABLE one (id int);")
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await apply_migrations(conn, tmp_path) == ["0001_one.sql"]
        (tmp_path / "0001_one.sql").write_text("CREATE TABLE one (id bigint);")
        (tmp_path / "0002_two.sql").write_text("CREATE TABLE two (id int);")
        with pytest.raises(MigrationChanged) as caught:
            await apply_migrations(conn, tmp_path)
        assert caught.value.names == ["0001_one.sql"]
        assert str(tmp_path / "0001_one.sql") in str(caught.value)
        assert await conn.fetchval("SELECT to_regclass('two')") is None  # nothing applied
        # Put back as applied: accepted again, and the new one applied.
        (tmp_path / "0001_one.sql").write_text("CREATE TABLE one (id int);")
        assert await apply_migrations(conn, tmp_path) == ["0002_two.sql"]
    finally:
        await conn.close()


async def test_checksums_are_recorded_once_for_databases_migrated_before_them(
    empty_database_url: str,
) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply_migrations(conn)
        # A database from before checksums: no such column.
        await conn.execute("ALTER TABLE schema_migrations DROP COLUMN checksum")
        assert await apply_migrations(conn) == []
        rows = await conn.fetch("SELECT name, checksum FROM schema_migrations")
        assert {r["name"]: r["checksum"] for r in rows} == {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in MIGRATIONS_DIR.glob("*.sql")
        }
        # Recorded once: a later mismatch is a change, not a new recording.
        await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1")
        with pytest.raises(MigrationChanged):
            await apply_migrations(conn)
    finally:
        await conn.close()
