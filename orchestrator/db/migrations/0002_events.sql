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

-- One round trip per append: lock (so positions commit in order), check an expected seq,
-- number each aggregate's events after its last seq, insert, notify.
CREATE FUNCTION append_events(
    p_ids uuid[], p_types text[], p_versions integer[], p_aggregates text[], p_data jsonb[],
    p_users text[], p_timestamp bigint, p_expected_aggregate text, p_expected_seq bigint
) RETURNS SETOF events LANGUAGE plpgsql AS $$
DECLARE
    actual bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(947735);
    IF p_expected_aggregate IS NOT NULL THEN
        SELECT coalesce(max(seq), 0) INTO actual FROM events WHERE aggregate_id = p_expected_aggregate;
        IF actual <> p_expected_seq THEN
            RAISE EXCEPTION 'seq_conflict' USING DETAIL = actual::text, ERRCODE = 'P0001';
        END IF;
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_ids, p_types, p_versions, p_aggregates, p_data, p_users)
            WITH ORDINALITY AS x(i, t, v, a, d, u, ord)
    ), last AS (
        SELECT s.a, coalesce((SELECT max(e.seq) FROM events e WHERE e.aggregate_id = s.a), 0) AS n
        FROM (SELECT DISTINCT input.a FROM input) s
    )
    INSERT INTO events (id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
    SELECT input.i, input.t, input.v, input.a,
           last.n + row_number() OVER (PARTITION BY input.a ORDER BY input.ord),
           p_timestamp, input.d, input.u
    FROM input JOIN last ON last.a = input.a
    ORDER BY input.ord
    RETURNING *;
    PERFORM pg_notify('orch_events', '');
END
$$;
