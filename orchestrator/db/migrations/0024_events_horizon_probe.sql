-- The horizon without scanning pg_locks (issue 31). `events_horizon()` (0014) reads every
-- lock of the server (pg_lock_status: every backend's fast-path slots, the whole shared lock
-- table under all 16 partition locks), on every follower read: measured at 50-170 us a call
-- with max_connections 100 and 0.2-1.3 ms with 1,000, growing with the connections, not with
-- the events (docs/design-notes.md). `events_horizon_from(known)` finds the same bound by
-- probing only the floor keys between a horizon already known and the last position drawn:
-- its cost follows the positions drawn since that horizon (each probed about once), not the
-- connections.
--
-- Writer (unchanged in spirit): before its first position a transaction holds a shared
-- advisory lock (947741, floor k mod 2^32) until it ends, k = the last position drawn, and
-- draws only positions > k. New: after taking the lock it reads the last position again and,
-- if a position was drawn meanwhile, takes the lock again at the new value (until it holds
-- still). So the sequence stood at k at an instant after the lock became visible.
--
-- Reader: L = the last position drawn; B = a horizon computed before (this process's, or
-- the last one any reader published in `events_horizon_seen`); probe keys B, B+1, ..., L-1
-- with pg_try_advisory_xact_lock: the first key some writer holds is the horizon; none: L.
-- (Key L needs no probe: a writer whose floor is L draws only positions > L.)
--
-- Why nothing at or below it can still appear: a position p <= H <= L was drawn before L
-- was read, so its writer's floor lock k (k < p) was taken before that. If that writer were
-- still in flight at the probe, and B <= k, the probe would have stopped at k or at a
-- smaller held key: H <= k < p. So it had ended, and Postgres releases locks only after a
-- commit is visible to new snapshots (the rows are read in a later statement). Why B <= k
-- for every writer in flight after the computation C' that found B: let t be the writer's
-- re-read, after its lock, at which the sequence stood at k. If t came after C' read L',
-- k >= L' >= B. If before, the lock was visible when C' probed and k <= L': C' stopped at
-- or below k, unless k was below C's own starting bound, and that cannot be, by the same
-- argument one computation earlier (the first starts from 0, or from a full scan of
-- pg_locks, which sees every lock). Without the re-read this fails: a writer that read k
-- just before C' read L' and locked it just after C' probed would hold a key below the next
-- reader's B while drawing positions above L'.
--
-- A probe that succeeds holds the key exclusively; the probes run in chunks of 64 inside a
-- subtransaction that is rolled back, so a reader holds at most 64 such locks, for
-- microseconds. A writer waits for one only in the instant between reading its floor and
-- locking it, and only when its floor is already below L (it then re-reads anyway).
-- A probe costs ~0.5 us: after 512 free keys (the first read after a crash, which empties
-- the unlogged `events_horizon_seen`, or a process reading rarely while no other reader
-- publishes) one full scan, `events_horizon()`, costs less than probing on.

-- The last horizon a reader found (any process): unlogged, so publishing it writes no WAL
-- and takes no transaction id; a crash empties it and the next read scans once.
CREATE UNLOGGED SEQUENCE events_horizon_seen MINVALUE 0 START 0;

-- The floor lock's second key: the position's low 32 bits, as a signed integer.
CREATE FUNCTION events_floor_key(k bigint) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ((k & 4294967295) - CASE WHEN k & 2147483648 <> 0 THEN 4294967296 ELSE 0 END)::integer
$$;

-- The writer's floor, once per transaction, before the transaction's first position. Returns
-- 'on' (the transaction-local setting that says it is held). Called by the SQL of the
-- appends only when the one-step try found the sequence moved (rare), and by
-- events_next_position for direct INSERTs.
DROP FUNCTION events_hold_floor();
CREATE FUNCTION events_hold_floor() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bigint;
BEGIN
    IF current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on' THEN
        LOOP
            k := coalesce(pg_sequence_last_value('events_position_seq'), 0);
            PERFORM pg_advisory_xact_lock_shared(947741, events_floor_key(k));
            EXIT WHEN coalesce(pg_sequence_last_value('events_position_seq'), 0) = k;
        END LOOP;
        PERFORM set_config('orch.events_floor_held', 'on', true);
    END IF;
    RETURN 'on';
END
$$;

-- As in 0014, the floor step replaced by the one with the re-read.
CREATE OR REPLACE FUNCTION append_events(
    p_ids uuid[], p_types text[], p_versions integer[], p_aggregates text[], p_data jsonb[],
    p_users text[], p_timestamp bigint, p_expected_aggregate text, p_expected_seq bigint
) RETURNS TABLE (out_position bigint, out_seq bigint) LANGUAGE plpgsql AS $$
DECLARE
    actual bigint;
    k integer;
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
    IF current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on' THEN
        PERFORM events_hold_floor();
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
END
$$;

-- As in 0019, with the re-read. The floor step is plain SQL for the common case: the lock
-- taken in a CTE (materialised: it holds a volatile call, so it runs before the outer
-- SELECT reads the sequence again), and the plpgsql loop only when the sequence moved in
-- between. The WHERE is a one-time filter: once the floor is held, nothing below it runs.
CREATE OR REPLACE FUNCTION append_event(
    p_id uuid, p_type text, p_version integer, p_aggregate text, p_data jsonb,
    p_user text, p_timestamp bigint
) RETURNS TABLE (out_position bigint, out_seq bigint) LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(947742, hashtext(p_aggregate));
    WITH taken AS (
        SELECT f.k, pg_advisory_xact_lock_shared(947741, events_floor_key(f.k)) AS held
        FROM (SELECT coalesce(pg_sequence_last_value('events_position_seq'), 0) AS k) f
    )
    SELECT CASE WHEN coalesce(pg_sequence_last_value('events_position_seq'), 0) = taken.k
                THEN set_config('orch.events_floor_held', 'on', true)
                ELSE events_hold_floor() END
    FROM taken
    WHERE current_setting('orch.events_floor_held', true) IS DISTINCT FROM 'on';
    INSERT INTO events (position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
    VALUES (nextval('events_position_seq'), p_id, p_type, p_version, p_aggregate,
            (SELECT coalesce(max(e.seq), 0) + 1 FROM events e WHERE e.aggregate_id = p_aggregate),
            p_timestamp, p_data, p_user)
    RETURNING position, seq;
$$;

-- The reader (see the header). `p_known`: a horizon this caller found before (0: none).
-- allocated > horizon: an append is in flight. Read the rows up to the horizon in a later
-- statement, outside an explicit REPEATABLE READ transaction.
CREATE FUNCTION events_horizon_from(p_known bigint, OUT horizon bigint, OUT allocated bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bigint;
    upto bigint;
    budget bigint;
BEGIN
    allocated := coalesce(pg_sequence_last_value('events_position_seq'), 0);
    k := least(allocated, greatest(p_known, coalesce(pg_sequence_last_value('events_horizon_seen'), 0)));
    -- After 512 free keys, or when the keys (positions mod 2^32) could alias, a scan.
    budget := CASE WHEN allocated - k < 4294967296 THEN k + 512 ELSE k END;
    horizon := allocated;
    WHILE k < allocated AND horizon = allocated LOOP
        IF k >= budget THEN
            -- Far behind with nothing held: one scan costs less than probing on.
            SELECT h.horizon, h.allocated INTO horizon, allocated FROM events_horizon() h;
            EXIT;
        END IF;
        upto := least(allocated, k + 64);
        BEGIN
            WHILE k < upto LOOP
                IF NOT pg_try_advisory_xact_lock(947741, events_floor_key(k)) THEN
                    horizon := k;
                    EXIT;
                END IF;
                k := k + 1;
            END LOOP;
            RAISE SQLSTATE 'OH001';  -- rolls the subtransaction back: the probes' locks go
        EXCEPTION WHEN SQLSTATE 'OH001' THEN
            NULL;
        END;
    END LOOP;
    IF horizon > coalesce(pg_sequence_last_value('events_horizon_seen'), 0) THEN
        PERFORM setval('events_horizon_seen', horizon);
    END IF;
END
$$;
