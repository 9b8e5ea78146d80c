-- Reverts 0021_join_free_writes.up.sql: wp_renew_leases and wp_complete
-- of version 6, wp_release_instances of version 20.

-- wp_renew_leases sets lease_expiry = now+lease on the rows of p_ids that are
-- pending and leased to p_instance_id with a lease that has not run out
-- (owner fencing: a lease lost to a peer is not stolen back, and a lease
-- that ran out is lost, since a peer may hold an earlier row of its stream
-- by now), extends the stream lease of their streams the caller owns (never
-- shortens it: it covers every row the owner holds), and returns the
-- renewed ids. Receptor leases are not renewable. Rows are locked in one
-- statement and written in the next (see wp_release_instances).
CREATE OR REPLACE FUNCTION {{.S}}.wp_renew_leases(
    p_instance_id uuid,
    p_category    text,
    p_ids         uuid[],
    p_lease_ns    bigint,
    p_now         timestamptz DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := COALESCE(p_now, now());
    v_exp     timestamptz;
    v_ids     uuid[];
    v_streams text[];
    v_tids    tid[];
BEGIN
    IF p_category IS NULL OR p_category NOT IN ({{.CatList}}) THEN
        RAISE EXCEPTION 'workpump: wp_renew_leases: unknown category %', p_category USING ERRCODE = 'WP002';
    END IF;
{{- range .Cats}}{{if not .Renewable}}
    IF p_category = '{{.Name}}' THEN
        RAISE EXCEPTION 'workpump: % leases are not renewable', p_category USING ERRCODE = 'WP003';
    END IF;
{{- end}}{{end}}
    IF p_lease_ns IS NULL OR p_lease_ns <= 0 THEN
        RAISE EXCEPTION 'workpump: wp_renew_leases: p_lease_ns must be > 0' USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id) THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;
    v_exp := v_now + {{.S}}.wp_ns(p_lease_ns);
{{range .Cats}}{{if .Renewable}}
    IF p_category = '{{.Name}}' THEN
        v_tids := ARRAY(
            SELECT t.ctid
              FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = ANY (p_ids) AND t.instance_id = p_instance_id AND (t.lease_expiry >= v_now) IS TRUE
             ORDER BY t.{{.Key}}
               FOR UPDATE);
        WITH up AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET lease_expiry = v_exp
             WHERE t.ctid = ANY (v_tids)
            RETURNING t.{{.Key}} AS k, t.stream_id)
        SELECT array_agg(up.k), array_agg(DISTINCT up.stream_id) FILTER (WHERE up.stream_id <> '')
          INTO v_ids, v_streams
          FROM up;
    END IF;
{{end}}{{end}}
    IF v_streams IS NOT NULL THEN
        -- SKIP LOCKED: a claim that holds the stream row is deciding its
        -- owner right now; the row leases (which guard order) are renewed anyway.
        UPDATE {{.S}}.wp_active_streams a
           SET lease_expiry = GREATEST(a.lease_expiry, v_exp)
          FROM (SELECT s.stream_id FROM {{.S}}.wp_active_streams s
                 WHERE s.stream_id = ANY (v_streams) AND (s.assigned_instance_id = p_instance_id) IS TRUE
                 ORDER BY s.stream_id
                   FOR NO KEY UPDATE SKIP LOCKED) l
         WHERE a.stream_id = l.stream_id;
    END IF;
    -- Test sessions (workpump.pause_points = on) can be held here, with the
    -- renewed rows locked, while a peer runs.
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('renew.after_update', p_instance_id);
    END IF;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT unnest(v_ids);
    END IF;
END
$fn$;

-- wp_complete completes handed-out attempts (parallel arrays category, id,
-- attempts), fenced: only rows still leased to p_instance_id at that attempt,
-- with a lease that has not run out, are applied (once it ran out, a peer may
-- hold an earlier row of the stream, and this row must wait for it). Rows are deleted, except inbox rows, which are kept with
-- processed_at set so a redelivered message id is deduplicated. Returns the
-- applied (category, id) pairs. Rows are found and written in one pass (a
-- nested loop over the ids sorted by key, so rows are locked in key order);
-- a row changed meanwhile is re-checked against the fence in its latest
-- version. (Locking first and writing by ctid took a second WAL record and
-- tuple change per row: about 12 % of the call.)
CREATE OR REPLACE FUNCTION {{.S}}.wp_complete(
    p_instance_id uuid,
    p_categories  text[],
    p_ids         uuid[],
    p_attempts    integer[],
    p_now         timestamptz DEFAULT NULL)
RETURNS TABLE (category text, id uuid)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := COALESCE(p_now, now());
    v_cat     text[] := '{}';
    v_ids     uuid[] := '{}';
    v_streams text[] := '{}';
    x_ids     uuid[];
    x_streams text[];
    x_parts   integer[];
    v_parts   integer[] := '{}';
    v_scats   text[] := '{}';
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts) THEN
        RAISE EXCEPTION 'workpump: wp_complete: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        WITH r AS MATERIALIZED (
            SELECT u.k, u.att FROM unnest(p_categories, p_ids, p_attempts) AS u(cat, k, att)
             WHERE u.cat = '{{.Name}}' ORDER BY u.k),
{{- if .Keeps}}
        d AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET {{.Done}} = v_now, instance_id = NULL, lease_expiry = NULL
              FROM r
             WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id AND (t.lease_expiry >= v_now) IS TRUE
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- else}}
        d AS (
            DELETE FROM {{$.S}}.{{.Table}} t
             USING r
             WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id AND (t.lease_expiry >= v_now) IS TRUE
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- end}}
        SELECT array_agg(d.k), array_agg(d.stream_id) FILTER (WHERE d.stream_id <> ''),
               array_agg(d.partition_number) FILTER (WHERE d.stream_id <> '')
          INTO x_ids, x_streams, x_parts FROM d;
        IF x_ids IS NOT NULL THEN
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_ids)]);
            v_ids := v_ids || x_ids;
            IF x_streams IS NOT NULL THEN
                v_streams := v_streams || x_streams;
                v_parts := v_parts || x_parts;
                v_scats := v_scats || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_streams)]);
            END IF;
        END IF;
    END IF;
{{- end}}
    IF cardinality(v_streams) > 0 THEN
        PERFORM {{.S}}.wp_settle_streams(p_instance_id, v_streams, v_parts, v_scats);
    END IF;
    RETURN QUERY SELECT u.c, u.k FROM unnest(v_cat, v_ids) AS u(c, k);
END
$fn$;

-- wp_release_instances (version 20: rows found on _wake) clears every
-- lease and stream ownership held by p_ids (attempts unchanged) and
-- returns how many work rows it released.
-- Rows are locked in one statement and written in the next: a row whose
-- lock it had to wait for (a renewal in flight) is a newer version than its
-- first snapshot can see, and only a later statement's snapshot finds it.
CREATE OR REPLACE FUNCTION {{.S}}.wp_release_instances(p_ids uuid[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_n integer := 0;
    v_c integer;
    v_tids tid[];
    v_one boolean := (SELECT count(DISTINCT u.id) <= 1 FROM unnest(p_ids) AS u(id));
BEGIN
{{- range .Cats}}
    -- The owners' rows are found on _wake, and then locked by key: a row a
    -- renewal wrote meanwhile is still found, at its new version. One
    -- owner's rows: a walk of _wake's entries testing its second key, which
    -- reads from the table only that owner's rows (an array test there
    -- would read every waiting row from the table). Several owners' (an
    -- eviction of more than one): a single walk of the leased rows'
    -- entries, reading every leased row, rather than a walk per owner.
    v_tids := ARRAY(
        SELECT t.ctid
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Key}} = ANY (ARRAY(
                   SELECT x.k
                     FROM (SELECT DISTINCT unnest(p_ids)) AS i(id)
                    CROSS JOIN LATERAL (
                          SELECT w.{{.Key}} AS k
                            FROM {{$.S}}.{{.Table}} w
                           WHERE w.{{.Done}} IS NULL AND w.instance_id IS NOT NULL AND w.instance_id = i.id
                          OFFSET 0) x
                    WHERE v_one
                   UNION ALL
                   SELECT w.{{.Key}}
                     FROM {{$.S}}.{{.Table}} w
                    WHERE NOT v_one AND w.{{.Done}} IS NULL AND w.instance_id IS NOT NULL
                      AND (w.instance_id = ANY (p_ids)) IS TRUE))
           -- (IS TRUE: spelled plainly, these tests imply _wake's predicate,
           -- and a plan made while the table was nearly empty, kept for the
           -- session, could walk _wake and read every leased row.)
           AND (t.{{.Done}} IS NULL AND t.instance_id = ANY (p_ids)) IS TRUE
         ORDER BY t.{{.Key}}
           FOR UPDATE);
    UPDATE {{$.S}}.{{.Table}} t
       SET instance_id = NULL, lease_expiry = NULL
     WHERE t.ctid = ANY (v_tids)
       AND t.instance_id = ANY (p_ids);
    GET DIAGNOSTICS v_c = ROW_COUNT;
    v_n := v_n + v_c;
{{- end}}
    UPDATE {{.S}}.wp_active_streams a
       SET assigned_instance_id = NULL, lease_expiry = NULL
      FROM (SELECT s.stream_id FROM {{.S}}.wp_active_streams s
             WHERE s.assigned_instance_id = ANY (p_ids)
             ORDER BY s.stream_id
               FOR NO KEY UPDATE) l
     WHERE a.stream_id = l.stream_id;
    RETURN v_n;
END
$fn$;
