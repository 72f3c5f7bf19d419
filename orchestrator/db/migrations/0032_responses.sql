-- Stored responses of the Responses API (issue 34, orchestrator/responses.py): what
-- `POST /responses` answered with `store` not false, kept `response_retention_s` (30 days by
-- default) for `GET/DELETE /responses/{id}`, `GET /responses/{id}/input_items` and for
-- `previous_response_id`, which rebuilds a conversation from the chain of these rows. A
-- response is its caller's: the primary key starts with user_uuid and every read names it.
CREATE TABLE responses (
    user_uuid            text   NOT NULL,
    id                   text   NOT NULL,          -- resp_<48 hex>
    model                text   NOT NULL,
    status               text   NOT NULL,          -- completed | incomplete | failed
    previous_response_id text,                     -- the caller's chain (same user_uuid)
    instructions         text,                     -- this response's own (never carried over)
    input_items          jsonb  NOT NULL,          -- the request's input items, each with its id
    response             jsonb  NOT NULL,          -- the Response object answered: output, usage...
    client_metadata      jsonb,                    -- a client's own pairs (Codex), never sent upstream
    created_at           bigint NOT NULL,          -- Unix ms, the database's clock
    expires_at           bigint NOT NULL,          -- created_at + response_retention_s
    PRIMARY KEY (user_uuid, id)
);

-- The purge (the replicas' heartbeat loop) deletes rows past expires_at.
CREATE INDEX responses_expires ON responses (expires_at);
