-- Interventions (issue 32, orchestrator/interventions): a person's decision a workflow waits
-- for, holding nothing meanwhile (no worker slot, no claim). Kind `tool`: a call under an
-- `ask` tool policy rule, its conversation sealed in `checkpoint`; kind `approval`: a step of
-- type approval. One decision: the first UPDATE ... WHERE status = 'pending' wins.
CREATE SEQUENCE intervention_seq;
CREATE TABLE interventions (
    id             text PRIMARY KEY,                -- 'iv-' || number
    number         bigint NOT NULL UNIQUE,          -- nextval('intervention_seq')
    kind           text NOT NULL CHECK (kind IN ('tool', 'approval')),
    status         text NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'approved', 'rejected', 'expired')),
    user_uuid      text NOT NULL,                   -- the workflow's owner
    deciders       text[] NOT NULL,                 -- who decides besides admins: [owner] or approvers
    workflow_id    text NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step           text NOT NULL,
    task_id        text NOT NULL,                   -- the step attempt's key (the events' aggregate)
    seq            integer NOT NULL,                -- 1, 2, ... within the attempt
    tool           text,
    arguments      jsonb,                           -- secrets masked
    question       text NOT NULL,
    checkpoint     bytea,                           -- the sealed conversation (kind tool)
    notify_channel text REFERENCES channels (id) ON DELETE SET NULL,
    expires_at     bigint NOT NULL,                 -- Unix ms, the database's clock
    created_at     bigint NOT NULL,
    decided_at     bigint,
    decided_by     jsonb,                           -- {user_uuid} | {platform, platform_user, channel_id}
    via            text CHECK (via IN ('api', 'slack', 'telegram', 'teams', 'webhook', 'timeout', 'cancel')),
    note           text,
    reason         text,
    interaction_id text,                            -- a platform's press id: a replay decides nothing
    resumed_at     bigint,                          -- its continuation was sent (at most once)
    UNIQUE (task_id, seq)
);
CREATE INDEX interventions_owner ON interventions (user_uuid, status, number DESC);
CREATE INDEX interventions_deciders ON interventions USING gin (deciders);
CREATE INDEX interventions_expiry ON interventions (expires_at) WHERE status = 'pending';
CREATE INDEX interventions_workflow ON interventions (workflow_id);
CREATE INDEX interventions_channel ON interventions (notify_channel);

-- The pending intervention a parked workflow waits for (NULL: drivable).
ALTER TABLE workflows ADD COLUMN waiting_for text;

-- The channel outbox of interventions: the question (`ask`), then the outcome, per channel.
CREATE TABLE intervention_posts (
    intervention_id text NOT NULL REFERENCES interventions (id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('ask', 'outcome')),
    channel_id      text NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'sent', 'failed', 'dropped')),
    ref             jsonb,                           -- the platform's message: what an update edits
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at bigint NOT NULL,
    error           text,
    PRIMARY KEY (intervention_id, kind)
);
CREATE INDEX intervention_posts_due ON intervention_posts (next_attempt_at) WHERE state = 'pending';
CREATE INDEX intervention_posts_channel ON intervention_posts (channel_id);
