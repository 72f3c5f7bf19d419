"""Every foreign key has an index whose leading columns are the FK's columns (issue 16,
item 5): without one, deleting a parent row or reading a parent's children scans the whole
child table."""

from __future__ import annotations

import asyncpg

from orchestrator.db import apply_migrations

# A foreign key with no plain (non-partial) index starting with exactly its columns.
_UNINDEXED = """
SELECT c.conrelid::regclass::text AS tbl, c.conname,
       array(SELECT attname FROM pg_attribute
             WHERE attrelid = c.conrelid AND attnum = ANY(c.conkey)) AS cols
FROM pg_constraint c
WHERE c.contype = 'f'
  AND NOT EXISTS (
      SELECT 1 FROM pg_index i
      WHERE i.indrelid = c.conrelid
        AND i.indpred IS NULL
        AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1]::int2[] @> c.conkey
        AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1]::int2[] <@ c.conkey)
ORDER BY 1, 2
"""


async def test_every_foreign_key_has_an_index(empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply_migrations(conn)
        assert await conn.fetchval("SELECT count(*) FROM pg_constraint WHERE contype = 'f'") > 0
        missing = [dict(r) for r in await conn.fetch(_UNINDEXED)]
        assert missing == [], f"foreign keys without an index: {missing}"
    finally:
        await conn.close()
