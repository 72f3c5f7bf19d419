-- One event appended beside a state change (`EventStore.append_with`: a memory store, ...),
-- the hot path of issue 17. The same steps as append_events' single-event path (0014), as
-- an SQL function with scalar arguments: asyncpg encodes no arrays, Postgres unpacks none,
-- and there is no PL/pgSQL interpreter in between (~15 us less a store, measured).
--
-- Each statement of a VOLATILE function runs with a fresh snapshot, as in PL/pgSQL, so the
-- steps keep their order and their meaning:
--   1. the aggregate's lock (appends to one aggregate take turns);
--   2. the floor lock, once per transaction, before the transaction's first position
--      (events_hold_floor, inlined: the WHERE skips it when already held);
--   3. the row, with seq = the aggregate's last + 1 read under the lock by this statement's
--      snapshot (taken after the lock was granted: a previous holder's commit is visible).
CREATE FUNCTION append_event(
    p_id uuid, p_type text, p_version integer, p_aggregate text, p_data jsonb,
    p_user text, p_timestamp bigint
) RETURNS TABLE (out_position bigint, out_seq bigint) LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(947742, hashtext(p_aggregate));
    SELECT pg_advisory_xact_lock_shared(
               947741, ((f.k & 4294967295) - CASE WHEN f.k & 2147483648 <> 0
                                                   THEN 4294967296 ELSE 0 END)::integer),
           set_config('orch.events_floor_held', 'on', true)
    FROM (SELECT coalesce(pg_sequence_last_value('events_position_seq'), 0) AS k) f
    WHERE current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on';
    INSERT INTO events (position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
    VALUES (nextval('events_position_seq'), p_id, p_type, p_version, p_aggregate,
            (SELECT coalesce(max(e.seq), 0) + 1 FROM events e WHERE e.aggregate_id = p_aggregate),
            p_timestamp, p_data, p_user)
    RETURNING position, seq;
$$;
