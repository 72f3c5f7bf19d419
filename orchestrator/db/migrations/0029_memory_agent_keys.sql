-- Memory keys are unique within the agent namespace again (SPEC part 2, issue 33), unless
-- `memory_key_scope = "owner"`. Databases written under migration 0011's per-owner keys may
-- hold several users' entries of one key: none is deleted. In each such group one entry
-- stays bound by the namespace's uniqueness (the ownerless one, else the oldest) and the
-- others are marked `per_owner`: they stay readable by their owners, and a new store by
-- anyone else is still a 403 (it meets the bound entry). Under "owner" scope a store that
-- finds another owner's entry of its key writes a `per_owner` entry too.
ALTER TABLE memory_entries ADD COLUMN per_owner boolean NOT NULL DEFAULT false;
UPDATE memory_entries AS m SET per_owner = true
  FROM (
    SELECT agent_id, owner, key,
           row_number() OVER (PARTITION BY agent_id, key
                              ORDER BY owner <> '', created_at, owner) AS n
      FROM memory_entries
  ) AS ranked
 WHERE ranked.n > 1 AND m.agent_id = ranked.agent_id AND m.owner = ranked.owner
   AND m.key = ranked.key;
CREATE UNIQUE INDEX memory_entries_agent_key ON memory_entries (agent_id, key)
  WHERE NOT per_owner;
