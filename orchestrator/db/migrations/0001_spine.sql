-- The spine: service facts, API tokens, uptime heartbeats.

CREATE TABLE service_facts (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE api_tokens (
    token_hash  text PRIMARY KEY,             -- sha256 hex of the token; the token is never stored
    prefix      text NOT NULL,                -- first characters, to name a token without it
    user_uuid   text NOT NULL,
    is_admin    boolean NOT NULL DEFAULT false,
    description text NOT NULL DEFAULT '',
    kind        text NOT NULL DEFAULT 'issued'  -- 'issued' (API/CLI) or 'configured' (admin_token)
                CHECK (kind IN ('issued', 'configured')),
    created_at  bigint NOT NULL,
    revoked_at  bigint
);
CREATE INDEX api_tokens_prefix ON api_tokens (prefix);
CREATE INDEX api_tokens_user ON api_tokens (user_uuid);

-- One row per minute in which the service answered; /slo computes 7-day uptime from it.
CREATE TABLE service_heartbeats (
    minute bigint PRIMARY KEY                 -- Unix minutes
);
