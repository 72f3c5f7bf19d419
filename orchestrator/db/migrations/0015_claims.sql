-- One ownership mechanism for durable work (issue 16, item 1): a claim per piece of work
-- (kind 'workflow' keyed by workflow id, kind 'scheduler' keyed 'leader', ...), held by one
-- owner until it expires unless renewed. `epoch` is the fencing token: a fresh value from
-- one sequence on every acquisition, so it only ever grows for a key even across a release
-- and a later re-acquisition. Every state-changing transaction of an owner locks its claim
-- row (FOR SHARE) and compares the epoch: a takeover (an UPDATE of the row) waits for that
-- transaction, and any later write of the old owner fails.

CREATE SEQUENCE claim_epoch;

CREATE TABLE claims (
    kind       text NOT NULL,
    key        text NOT NULL,
    owner      text NOT NULL,                  -- who holds it: e.g. 'workflow-shard-1/<gen>'
    epoch      bigint NOT NULL,                -- nextval('claim_epoch') at acquisition
    expires_at bigint NOT NULL,                -- Unix ms, the database's clock
    PRIMARY KEY (kind, key)
);

-- Every foreign key column gets an index (issue 16, item 5): a parent's delete or a
-- per-parent read otherwise scans the child table. tests/integration/test_fk_indexes.py
-- asserts that every FK has one.
CREATE INDEX IF NOT EXISTS workflow_step_results_workflow
    ON workflow_step_results (workflow_id);
CREATE INDEX IF NOT EXISTS scheduled_runs_job ON scheduled_runs (job_id);
CREATE INDEX IF NOT EXISTS skill_reports_skill ON skill_reports (skill_id);
