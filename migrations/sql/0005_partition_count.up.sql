-- workpump schema, version 5: the schema records its partition count.
--
-- Rows are enqueued with partition_number = hash(stream) mod the partition
-- count, and ranks map partitions to live instances. Two processes that
-- disagree on the count route one stream's rows to different partitions,
-- which silently breaks the one-owner-per-stream rule. The schema therefore
-- keeps the count in a one-row settings table, and a driver refuses to start
-- when its configured count differs.
--
-- The row is written once: by `workpump migrate up --partition-count N`, or
-- otherwise by the first driver that checks the schema (it records its own
-- configured count). It is never updated by the pump: changing the count of
-- a schema that holds work would re-route streams under their owners. An
-- operator who means it (empty queues, every process stopped) deletes the
-- row as the schema owner; the next start records the new count.

CREATE TABLE {{.S}}.wp_settings (
    id              boolean     PRIMARY KEY DEFAULT true CHECK (id),
    partition_count integer     NOT NULL CHECK (partition_count > 0),
    recorded_at     timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {{.S}}.wp_settings IS
    'workpump: settings every process sharing the schema must agree on (one row)';
COMMENT ON COLUMN {{.S}}.wp_settings.partition_count IS
    'workpump: partition count rows are enqueued with; a driver configured with another count refuses to start';

-- wp_partition_count records p_count as the schema's partition count when
-- none is recorded yet, and returns the recorded count (the caller compares
-- it with its own). Concurrent first calls agree: the insert that loses the
-- conflict waits for the winner, and the read that follows sees its row.
CREATE FUNCTION {{.S}}.wp_partition_count(p_count integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_count integer;
BEGIN
    IF p_count IS NULL OR p_count <= 0 THEN
        RAISE EXCEPTION 'workpump: wp_partition_count: p_count must be > 0' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{.S}}.wp_settings (id, partition_count, recorded_at)
    VALUES (true, p_count, COALESCE(p_now, now()))
    ON CONFLICT (id) DO NOTHING;
    SELECT s.partition_count INTO v_count FROM {{.S}}.wp_settings s WHERE s.id;
    RETURN v_count;
END
$fn$;
