-- Agent teams (issue 33, orchestrator/teams): a `coordinate` step with `team` gets a team,
-- keyed by its workflow and step (not the attempt: a coordinator run again after a lost
-- worker finds the same team and its unread mail). Every row carries its owner's user_uuid;
-- reads are scoped by it. Time is Unix ms from the database's clock.
CREATE TABLE teams (
    id           text PRIMARY KEY,                -- 'team-' || number
    number       bigint NOT NULL UNIQUE,
    user_uuid    text NOT NULL,                   -- the workflow's owner
    workflow_id  text NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step         text NOT NULL,
    max_members  integer NOT NULL CHECK (max_members BETWEEN 1 AND 8),
    state        text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'destroyed')),
    coordinator  text,                            -- the task id of the run that holds it
    created_at   bigint NOT NULL,
    destroyed_at bigint,
    reason       text,                            -- why it was destroyed
    UNIQUE (workflow_id, step)
);
CREATE SEQUENCE team_seq;
CREATE INDEX teams_owner ON teams (user_uuid, number DESC);

CREATE TABLE team_members (
    team_id      text NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name         text NOT NULL,                   -- 'm1', 'm2', ... within the team
    user_uuid    text NOT NULL,
    role         text NOT NULL,
    instructions text NOT NULL,
    tools        text[],                          -- NULL: every tool the step may use
    model        text,
    state        text NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'finished', 'failed', 'dismissed', 'stopped')),
    task_id      text NOT NULL,
    result       text,
    error        text,
    joined_at    bigint NOT NULL,
    left_at      bigint,
    PRIMARY KEY (team_id, name)
);

CREATE TABLE team_mail (
    id         bigserial PRIMARY KEY,
    team_id    text NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    user_uuid  text NOT NULL,
    sender     text NOT NULL,                     -- 'coordinator' or a member's name
    recipient  text NOT NULL,
    body       text NOT NULL,                     -- the owner's data: never in events
    size       integer NOT NULL,                  -- bytes of UTF-8
    sent_at    bigint NOT NULL,
    read_at    bigint
);
CREATE INDEX team_mail_team ON team_mail (team_id, id);
CREATE INDEX team_mail_unread ON team_mail (team_id, recipient, id) WHERE read_at IS NULL;
