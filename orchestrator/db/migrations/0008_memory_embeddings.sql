-- Memory embeddings filled in after the write (SPEC part 4: generated from the value when
-- omitted, best effort): an entry stored without an embedding while an embedder is
-- configured is `embed_pending` until a filler (any replica) embeds it; a filler that
-- fails gives up on an entry after a few attempts.

ALTER TABLE memory_entries
    ADD COLUMN embed_pending  boolean NOT NULL DEFAULT false,
    ADD COLUMN embed_attempts smallint NOT NULL DEFAULT 0;
CREATE INDEX memory_entries_embed_pending ON memory_entries (updated_at) WHERE embed_pending;
