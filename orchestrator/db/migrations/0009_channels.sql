-- Channels (SPEC part 4 "Channels"): integrations with messaging platforms. A channel's
-- secrets (signing_secret, bot_token, ...) are kept encrypted (Fernet) apart from its plain
-- config; its webhook token is kept only as a sha256 hash (shown once, at creation).
-- Inbound messages are written to `channel_inbox` before the webhook is answered (dedupe on
-- the platform's delivery id), then answered and delivered by a ChannelHub; `channel_turns`
-- is each conversation's history.

CREATE SEQUENCE channel_seq;

CREATE TABLE channels (
    id          text PRIMARY KEY,                 -- ch-<n>
    user_uuid   text NOT NULL,                    -- the owner: messages run as this user
    type        text NOT NULL,
    name        text NOT NULL,
    config      jsonb NOT NULL,                   -- non-secret settings
    secrets     bytea,                            -- Fernet token of a JSON object
    token_hash  text NOT NULL UNIQUE,             -- sha256 hex of the webhook token
    status      text NOT NULL DEFAULT 'active',   -- active | paused | error
    failures    integer NOT NULL DEFAULT 0,       -- outbound failures in a row
    last_error  text,
    created_at  bigint NOT NULL,
    updated_at  bigint NOT NULL
);
CREATE INDEX channels_owner ON channels (user_uuid, created_at);

CREATE TABLE channel_inbox (
    id              bigserial PRIMARY KEY,
    channel_id      text NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    delivery_id     text,                         -- the platform's id: processed once
    conversation    text NOT NULL,
    text            text NOT NULL,
    sender          text,
    reply           jsonb NOT NULL,               -- what answering needs (chat id, thread...)
    state           text NOT NULL DEFAULT 'pending', -- pending | sending | done | failed
    answer          text,
    task_id         text,
    attempts        integer NOT NULL DEFAULT 0,   -- delivery attempts
    next_attempt_at bigint NOT NULL,
    error           text,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL,
    UNIQUE (channel_id, delivery_id)
);
CREATE INDEX channel_inbox_due ON channel_inbox (next_attempt_at) WHERE state IN ('pending', 'sending');

CREATE TABLE channel_turns (
    id            bigserial PRIMARY KEY,
    channel_id    text NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    conversation  text NOT NULL,
    role          text NOT NULL,                  -- user | assistant
    text          text NOT NULL,
    created_at    bigint NOT NULL
);
CREATE INDEX channel_turns_conversation ON channel_turns (channel_id, conversation, id DESC);
