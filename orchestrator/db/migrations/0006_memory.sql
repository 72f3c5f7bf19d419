-- Memory (SPEC part 4 "Memory", part 2 memory entry): per-agent key-value entries with
-- full-text search. The pgvector column and its HNSW index are added by the service at start
-- when pgvector is available (their dimension is configuration); `embedding_raw` keeps a
-- given embedding whatever the server has.

CREATE TABLE memory_entries (
    agent_id      text NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    user_uuid     text,                          -- the owner; NULL: visible to everyone
    created_at    bigint NOT NULL,               -- Unix ms
    updated_at    bigint NOT NULL,
    expires_at    bigint,                        -- NULL: never
    pinned        boolean NOT NULL DEFAULT false,
    importance    real NOT NULL DEFAULT 1.0,
    accessed_at   bigint NOT NULL,
    access_count  integer NOT NULL DEFAULT 0,
    embedding_raw real[],
    search        tsvector GENERATED ALWAYS AS
                  (to_tsvector('english', key || ' ' || value)) STORED,
    PRIMARY KEY (agent_id, key)
);
CREATE INDEX memory_entries_search ON memory_entries USING gin (search);
CREATE INDEX memory_entries_owner ON memory_entries (agent_id, user_uuid);
CREATE INDEX memory_entries_expiry ON memory_entries (expires_at) WHERE expires_at IS NOT NULL;
