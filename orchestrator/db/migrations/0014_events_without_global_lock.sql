-- Appends without a global lock (issue 16, item 4). Until now every append took
-- pg_advisory_xact_lock(947735) until commit, so positions committed in order and a reader
-- could follow `position > last seen`. Now appends in different transactions run and commit
-- at the same time, so a position can become visible while a smaller one is still in flight;
-- a reader that follows positions must then stop below it. This migration gives readers the
-- bound (`events_horizon`) and keeps seq gapless per aggregate with a lock per aggregate.
-- (NOTIFY moved out of the append, see append_events below.)
--
-- Why not "read only rows whose xid is below the snapshot's xmin": positions come from a
-- sequence, and a transaction can own an older xid than one that drew a smaller position
-- (its xid came with an earlier write), so xid order is not position order and that guard
-- still lets a reader pass an in-flight position. What we use instead:
--
--  * Writer: before its first position, a transaction reads k = the last position handed out
--    and holds a shared advisory lock (947741, k mod 2^32) until it ends; every position it
--    then draws is > k. (Shared: appenders never wait for each other here.)
--  * Reader (`events_horizon`): L = last position handed out; then the floors k of every
--    such lock held now (pg_locks); horizon H = min(L, every k). Then, in a LATER statement
--    (a newer snapshot), read positions <= H.
--  * Why nothing at or below H can still appear: a position p <= H <= L was drawn before L
--    was read, by a transaction whose lock (floor < p) was taken before that. Had it still
--    held the lock when pg_locks was read, H would be <= its floor < p. So it had ended, and
--    Postgres releases locks only after a commit is visible to new snapshots: the later
--    snapshot sees p if it committed; if it aborted, p never appears.
--
-- The lock key keeps k's low 32 bits; the reader restores k from a second read of the
-- sequence (k <= that value, and fewer than 2^32 positions are drawn meanwhile).
-- The sequence must hand out one value at a time (CACHE 1, the default) for L to be the
-- last position drawn. Inserts that bypass append_events still take a position through
-- events_next_position (the column default), so they are covered too.

ALTER SEQUENCE events_position_seq CACHE 1;

-- The writer's half: once per transaction (the setting is transaction-local and, like the
-- lock, undone when a savepoint rolls back), before the transaction's first position.
CREATE FUNCTION events_hold_floor() RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bigint;
BEGIN
    IF current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on' THEN
        k := coalesce(pg_sequence_last_value('events_position_seq'), 0);
        PERFORM pg_advisory_xact_lock_shared(
            947741, ((k & 4294967295) - CASE WHEN k & 2147483648 <> 0
                                              THEN 4294967296 ELSE 0 END)::integer);
        PERFORM set_config('orch.events_floor_held', 'on', true);
    END IF;
END
$$;

CREATE FUNCTION events_next_position() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM events_hold_floor();
    RETURN nextval('events_position_seq');
END
$$;

ALTER TABLE events ALTER COLUMN position SET DEFAULT events_next_position();

-- Every position <= horizon that will ever commit is visible to any snapshot taken after
-- this returns (read them in a later statement). allocated > horizon: an append is in flight.
CREATE FUNCTION events_horizon(OUT horizon bigint, OUT allocated bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    floors bigint[];
    after bigint;
BEGIN
    allocated := coalesce(pg_sequence_last_value('events_position_seq'), 0);
    SELECT array_agg(l.objid::bigint) INTO floors
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.classid = 947741 AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());
    after := coalesce(pg_sequence_last_value('events_position_seq'), 0);
    SELECT least(allocated, min(after - ((after - f) % 4294967296 + 4294967296) % 4294967296))
    INTO horizon
    FROM unnest(coalesce(floors, '{}')) AS f;
END
$$;

-- As in 0002, minus the global lock: each aggregate's appends take turns (so seq stays
-- gapless and follows position order within the aggregate); aggregates locked in one order,
-- so two appends to the same aggregates cannot deadlock each other. Returns only what the
-- caller does not know (position, seq); one event, the common case, takes a shorter path.
DROP FUNCTION append_events(uuid[], text[], integer[], text[], jsonb[], text[], bigint, text, bigint);
CREATE FUNCTION append_events(
    p_ids uuid[], p_types text[], p_versions integer[], p_aggregates text[], p_data jsonb[],
    p_users text[], p_timestamp bigint, p_expected_aggregate text, p_expected_seq bigint
) RETURNS TABLE (out_position bigint, out_seq bigint) LANGUAGE plpgsql AS $$
DECLARE
    actual bigint;
    k integer;
    floor_k bigint;
BEGIN
    IF cardinality(p_ids) = 1 THEN
        PERFORM pg_advisory_xact_lock(947742, hashtext(p_aggregates[1]));
        SELECT coalesce(max(e.seq), 0) INTO actual FROM events e
        WHERE e.aggregate_id = p_aggregates[1];
    ELSE
        FOR k IN SELECT DISTINCT hashtext(a) FROM unnest(p_aggregates) AS a ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(947742, k);
        END LOOP;
        IF p_expected_aggregate IS NOT NULL THEN
            SELECT coalesce(max(e.seq), 0) INTO actual FROM events e
            WHERE e.aggregate_id = p_expected_aggregate;
        END IF;
    END IF;
    IF p_expected_aggregate IS NOT NULL AND actual <> p_expected_seq THEN
        RAISE EXCEPTION 'seq_conflict' USING DETAIL = actual::text, ERRCODE = 'P0001';
    END IF;
    -- events_hold_floor(), inlined (this is the hot path).
    IF current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on' THEN
        floor_k := coalesce(pg_sequence_last_value('events_position_seq'), 0);
        PERFORM pg_advisory_xact_lock_shared(
            947741, ((floor_k & 4294967295) - CASE WHEN floor_k & 2147483648 <> 0
                                                  THEN 4294967296 ELSE 0 END)::integer);
        PERFORM set_config('orch.events_floor_held', 'on', true);
    END IF;
    IF cardinality(p_ids) = 1 THEN
        RETURN QUERY
        INSERT INTO events (position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
        VALUES (nextval('events_position_seq'), p_ids[1], p_types[1], p_versions[1],
                p_aggregates[1], actual + 1, p_timestamp, p_data[1], p_users[1])
        RETURNING events.position, events.seq;
    ELSE
        RETURN QUERY
        WITH input AS (
            SELECT * FROM unnest(p_ids, p_types, p_versions, p_aggregates, p_data, p_users)
                WITH ORDINALITY AS x(i, t, v, a, d, u, ord)
        ), last AS (
            SELECT s.a, coalesce((SELECT max(e.seq) FROM events e WHERE e.aggregate_id = s.a), 0) AS n
            FROM (SELECT DISTINCT input.a FROM input) s
        ), numbered AS (
            SELECT input.*, last.n + row_number() OVER (PARTITION BY input.a ORDER BY input.ord) AS sq
            FROM input JOIN last ON last.a = input.a
        )
        INSERT INTO events AS e (position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
        SELECT nextval('events_position_seq'), i, t, v, a, sq, p_timestamp, d, u
        FROM (SELECT * FROM numbered ORDER BY ord) ordered
        RETURNING e.position, e.seq;
    END IF;
    -- No NOTIFY here any more: a notifying transaction holds Postgres' notify-queue lock
    -- through its commit (WAL flush included), which would serialise appenders' commits
    -- again. The store notifies after commit instead (EventStore._notify_soon).
END
$$;
