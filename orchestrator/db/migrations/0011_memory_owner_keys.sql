-- Memory keys are unique per owner (agent_id, owner, key): two users' `config` in one
-- namespace are two entries, and neither can learn of the other's. Ownerless entries (owner
-- '') stay one per key, visible to everyone (SPEC part 5 rule 6).
ALTER TABLE memory_entries
    ADD COLUMN owner text GENERATED ALWAYS AS (coalesce(user_uuid, '')) STORED;
ALTER TABLE memory_entries DROP CONSTRAINT memory_entries_pkey;
ALTER TABLE memory_entries ADD CONSTRAINT memory_entries_pkey PRIMARY KEY (agent_id, owner, key);
