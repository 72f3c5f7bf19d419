-- Step retries (issue 32). A failed attempt of a task step whose `retry` allows another
-- runs again as a new attempt (its own key '<workflow>:<step>:<attempt>') after a backoff;
-- the step stays 'running' meanwhile.
--   retry_at: when the next attempt is due (Unix ms, the database's clock) while the step
--             waits for it; a restarted shard resumes the wait from here (NULL: not waiting).
--   attempts: the earlier attempts of this run of the step that ended without a result,
--             [{attempt, started_at, ended_at, error, lost?}]: failed (retried), or lost
--             (their worker or driver stopped; never sent again). The current attempt is
--             the row's own attempt, started_at, finished_at and error. Emptied when the
--             step runs afresh (a branch jumping back to it).
ALTER TABLE workflow_steps
    ADD COLUMN retry_at bigint,
    ADD COLUMN attempts jsonb NOT NULL DEFAULT '[]';
