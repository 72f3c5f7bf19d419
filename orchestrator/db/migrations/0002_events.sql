-- The event store: append-only, a global position for streaming, a gapless seq per aggregate.

CREATE TABLE events (
    position     bigserial PRIMARY KEY,
    id           uuid NOT NULL UNIQUE,
    type         text NOT NULL,
    version      integer NOT NULL CHECK (version >= 1),
    aggregate_id text NOT NULL,
    seq          bigint NOT NULL CHECK (seq >= 1),
    timestamp    bigint NOT NULL,                  -- Unix ms
    data         jsonb NOT NULL,
    user_uuid    text,                             -- owner; NULL for system events
    CONSTRAINT events_aggregate_seq UNIQUE (aggregate_id, seq)
);
CREATE INDEX events_user_position ON events (user_uuid, position);
CREATE INDEX events_type_position ON events (type, position);

CREATE FUNCTION events_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();

-- Where each projection has got to; it advances in the same transaction as the projection.
CREATE TABLE projection_checkpoints (
    name     text PRIMARY KEY,
    position bigint NOT NULL DEFAULT 0
);

-- The projection the service ships: committed events per type (feeds svc_event_total).
CREATE TABLE event_type_counts (
    type  text PRIMARY KEY,
    count bigint NOT NULL
);
