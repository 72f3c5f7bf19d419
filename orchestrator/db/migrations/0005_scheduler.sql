-- Scheduled jobs (SPEC parts 2-4, 8) and their runs.

CREATE TABLE scheduled_jobs (
    id                 bigserial PRIMARY KEY,
    name               text NOT NULL,
    user_uuid          text NOT NULL,                 -- the creator: tasks run as them
    prompt             text NOT NULL,
    model              text,
    opts               jsonb NOT NULL DEFAULT '{}',   -- mode, tools, timeout, tz, overlap
    schedule_type      text NOT NULL CHECK (schedule_type IN ('cron', 'every', 'at')),
    cron_expr          text,
    interval_ms        bigint,
    at_ms              bigint,
    tz                 text NOT NULL DEFAULT 'UTC',
    overlap            text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow', 'queue')),
    delete_after_run   boolean NOT NULL DEFAULT false,
    enabled            boolean NOT NULL DEFAULT true,
    next_run           bigint,                        -- Unix ms; NULL: nothing left to run
    last_run           bigint,
    last_result        text CHECK (last_result IN ('ok', 'error', 'timeout')),
    last_error         text,
    consecutive_errors integer NOT NULL DEFAULT 0,
    running            integer NOT NULL DEFAULT 0,    -- runs in flight
    queued             boolean NOT NULL DEFAULT false, -- overlap=queue: one run waits
    run_requested      boolean NOT NULL DEFAULT false, -- POST /run: dispatch at once
    paused_reason      text,
    created_at         bigint NOT NULL,
    updated_at         bigint NOT NULL
);
-- The tick asks for due jobs.
CREATE INDEX scheduled_jobs_due ON scheduled_jobs (next_run)
    WHERE enabled AND next_run IS NOT NULL;

CREATE TABLE scheduled_runs (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL REFERENCES scheduled_jobs (id) ON DELETE CASCADE,
    task_id     text NOT NULL,
    catchup     boolean NOT NULL DEFAULT false,
    started_at  bigint NOT NULL,
    finished_at bigint,
    result      text CHECK (result IN ('ok', 'error', 'timeout')),
    error       text
);
-- Runs a crash interrupted are found on start-up.
CREATE INDEX scheduled_runs_open ON scheduled_runs (job_id) WHERE finished_at IS NULL;
