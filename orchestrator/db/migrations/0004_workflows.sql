-- Workflows (SPEC parts 2-4): instances, their steps, and templates.

CREATE SEQUENCE workflow_seq;

CREATE TABLE workflows (
    id          text PRIMARY KEY,                -- 'wf-' || number
    number      bigint NOT NULL UNIQUE,          -- nextval('workflow_seq'); picks the shard
    user_uuid   text NOT NULL,                   -- the creator: every step's task is theirs
    name        text NOT NULL,
    status      text NOT NULL
                CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    spec        jsonb NOT NULL,                  -- {name, steps, model}, variables filled
    parent_id   text REFERENCES workflows (id) ON DELETE CASCADE,
    parent_step text,
    cursor      integer NOT NULL DEFAULT 0,      -- index of the step to run next
    executed    integer NOT NULL DEFAULT 0,      -- steps executed (guards branch loops)
    ending      text CHECK (ending IN ('failed', 'cancelled')),  -- compensating towards
    error       text,
    created_at  bigint NOT NULL,                 -- Unix ms
    updated_at  bigint NOT NULL
);
CREATE INDEX workflows_user ON workflows (user_uuid, number DESC);
CREATE INDEX workflows_parent ON workflows (parent_id, number);
-- A (re)starting shard looks for its unfinished workflows.
CREATE INDEX workflows_unfinished ON workflows (number) WHERE status IN ('pending', 'running');

CREATE TABLE workflow_steps (
    workflow_id     text NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    idx             integer NOT NULL,
    name            text NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'skipped')),
    attempt         integer NOT NULL DEFAULT 0,
    idempotency_key text UNIQUE,                 -- '<workflow>:<step>:<attempt>' of the run
    result          text,
    error           text,
    compensated     boolean NOT NULL DEFAULT false,
    started_at      bigint,
    finished_at     bigint,
    PRIMARY KEY (workflow_id, idx),
    UNIQUE (workflow_id, name)
);

-- Every recorded step result, once per attempt key: a re-run after a crash cannot record
-- a second result for the same attempt.
CREATE TABLE workflow_step_results (
    idempotency_key text PRIMARY KEY,
    workflow_id     text NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step            text NOT NULL,
    status          text NOT NULL,
    recorded_at     bigint NOT NULL
);

CREATE TABLE workflow_templates (
    owner      text NOT NULL,                    -- a user_uuid, or '' for a shared template
    name       text NOT NULL,
    steps      jsonb NOT NULL,
    variables  text[] NOT NULL,
    created_by text NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    PRIMARY KEY (owner, name)
);
