"""The SQL text of memory's writes that depends on the deployment (pgvector, the
`memory_key_scope` setting): built once per shape, kept out of `_store.py`'s logic."""

from __future__ import annotations

import functools


def like_pattern(glob: str) -> str:
    """A glob (`*`, `?`) as a LIKE pattern (with `\\` escaping LIKE's own wildcards)."""
    out = []
    for ch in glob:
        if ch in "%_\\":
            out.append("\\" + ch)
        elif ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)


@functools.cache
def store_ctes(pgvector: bool) -> tuple[str, str]:
    """A store's upsert (`MemoryStore.store`) as the CTEs `purged` and `entry` of the
    writer's statement: one row version, the pgvector column (when there is one) written
    with the rest.

    `purged`, under "agent" scope only: other owners' EXPIRED entries of the key (they
    answer 410 to everyone) are deleted first, so a key whose holder's entry has expired
    is free at once, not only after a decay. The insert reads `purged` (its WHERE), which
    makes Postgres run the DELETE to its end before it; a row deleted by the statement's
    own transaction no longer counts for the unique index."""
    vcol, vval, vset = (
        (", embedding", ", $7::real[]::vector", " embedding = EXCLUDED.embedding,")
        if pgvector
        else ("", "", "")
    )
    purged = (
        "purged AS (DELETE FROM memory_entries WHERE NOT $9::bool AND agent_id = $1"
        " AND key = $2 AND owner <> coalesce($4::text, '') AND expires_at <= $5"
        " RETURNING user_uuid)"
    )
    return purged, (
        "entry AS (INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
        f" updated_at, expires_at, accessed_at, embedding_raw, embed_pending, per_owner{vcol})"
        f" SELECT $1, $2, $3, $4, $5, $5, $6, $5, $7, $8,"
        # "owner" scope ($9): outside the namespace's unique index when another owner holds
        # the key; "agent" scope: inside it, so another owner's entry is a unique violation.
        " $9::bool AND EXISTS (SELECT 1 FROM memory_entries WHERE agent_id = $1 AND key = $2"
        f" AND owner <> coalesce($4::text, ''))"
        f"{vval}"
        " WHERE (SELECT count(*) FROM purged) >= 0"
        " ON CONFLICT (agent_id, owner, key) DO UPDATE SET value = EXCLUDED.value,"
        # Strictly increasing per row: the version the filler compares (two stores in one
        # millisecond, or a clock behind, still make a newer version).
        " updated_at = greatest(EXCLUDED.updated_at, memory_entries.updated_at + 1),"
        " expires_at = EXCLUDED.expires_at,"
        f" embedding_raw = EXCLUDED.embedding_raw,{vset} importance = 1.0,"
        " embed_pending = EXCLUDED.embed_pending, embed_attempts = 0"
        " RETURNING created_at, user_uuid, pinned)"
    )


@functools.cache
def share_sql(pgvector: bool, per_owner: bool) -> tuple[str, str]:
    """`MemoryStore.share`'s two statements ($1 source, $2 target, $3 LIKE pattern, $4 now):
    the eviction of other owners' entries of the copied keys in the target (run under
    "agent" scope only) and the copy itself."""
    vector_col = ", embedding" if pgvector else ""
    if per_owner:
        # A second owner's entry of a key in `target` is outside the namespace's index.
        picked = (
            "SELECT s.*, s.per_owner OR EXISTS (SELECT 1 FROM memory_entries t"
            " WHERE t.agent_id = $2 AND t.key = s.key AND t.owner <> s.owner) AS marked"
            " FROM memory_entries s WHERE s.agent_id = $1 AND s.key LIKE $3"
            " AND (s.expires_at IS NULL OR s.expires_at > $4)"
        )
    else:
        # One entry per key (the bound one of a group left from before 0029).
        picked = (
            "SELECT DISTINCT ON (key) *, false AS marked FROM memory_entries"
            " WHERE agent_id = $1 AND key LIKE $3 AND (expires_at IS NULL OR expires_at > $4)"
            " ORDER BY key, per_owner, owner <> '', created_at, owner"
        )
    # Under "agent" scope other owners' entries of the copied keys in `target` go first.
    evict = (
        "DELETE FROM memory_entries t USING (" + picked + ") AS p"
        " WHERE t.agent_id = $2 AND t.key = p.key AND t.owner <> p.owner"
        " RETURNING t.agent_id, t.user_uuid, t.key"
    )
    sql = (
        "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at, updated_at,"
        f" expires_at, pinned, importance, accessed_at, embedding_raw, embed_pending,"
        f" embed_attempts, per_owner{vector_col})"
        " SELECT $2, key, value, user_uuid, $4, $4, expires_at, pinned, importance, $4,"
        f" embedding_raw, embed_pending, embed_attempts, marked{vector_col}"
        f" FROM ({picked}) AS p"
        # A copy replaces a same-named entry whole: value, owner, vector and its state.
        " ON CONFLICT (agent_id, owner, key) DO UPDATE SET value = EXCLUDED.value,"
        " updated_at = EXCLUDED.updated_at,"
        " expires_at = EXCLUDED.expires_at, pinned = EXCLUDED.pinned,"
        " importance = EXCLUDED.importance, embedding_raw = EXCLUDED.embedding_raw,"
        " embed_pending = EXCLUDED.embed_pending, embed_attempts = EXCLUDED.embed_attempts"
        + (", embedding = EXCLUDED.embedding" if pgvector else "")
        + " RETURNING agent_id, user_uuid, key"
    )
    return evict, sql
