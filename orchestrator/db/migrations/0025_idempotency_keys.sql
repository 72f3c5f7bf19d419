-- Idempotency keys of creating POSTs (issue 32, orchestrator/idempotency.py): the first
-- request with a key claims it (a pending row, status_code NULL) and records its answer when
-- it has created its object (in the creation's own transaction where it has one); a request
-- with the same key and fingerprint replays that answer, another fingerprint is a 409.
-- Keys are the caller's: the primary key starts with user_uuid.
CREATE TABLE idempotency_keys (
    user_uuid    text NOT NULL,
    key          text NOT NULL,               -- the Idempotency-Key header, 1-255 printable ASCII
    fingerprint  text NOT NULL,               -- sha256 (hex) of method, path and canonical body
    token        text NOT NULL,               -- the claim of the request executing it (a fence)
    status_code  integer,                     -- NULL: pending (being executed)
    response     text,                        -- the first answer's JSON body, as sent
    created_at   bigint NOT NULL,             -- Unix ms, the database's clock
    locked_until bigint NOT NULL,             -- a pending row's claim may be taken over after
    expires_at   bigint NOT NULL,             -- created_at + idempotency_ttl_s
    PRIMARY KEY (user_uuid, key)
);

-- The purge (the replicas' heartbeat loop) deletes rows past expires_at.
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);
