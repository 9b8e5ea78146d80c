-- workpump schema, version 6: lease fences hold under concurrent writers.
--
-- wp_release_instances (deregistration and eviction), wp_renew_leases and
-- wp_release locked their rows and wrote them in one statement, addressing
-- them by ctid. A row whose lock had to be waited for (a renewal committing
-- meanwhile) is then a newer version than the statement's snapshot sees, so
-- the write skipped it: a deregistered instance kept a lease, and a release
-- reported an attempt lost that it still held. Each now locks in one
-- statement and writes in the next. A renewal no longer revives a lease that
-- ran out, nor shortens a stream's lease.

-- wp_release_instances clears every lease and stream ownership held by
-- p_ids (attempts unchanged) and returns how many work rows it released.
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
BEGIN
{{- range .Cats}}
    v_tids := ARRAY(
        SELECT t.ctid
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.instance_id = ANY (p_ids)
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
             WHERE t.{{.Key}} = ANY (p_ids) AND t.instance_id = p_instance_id AND t.lease_expiry >= v_now
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

-- wp_release clears the leases of attempts the caller never ran and gives
-- the attempt back (attempts - 1), fenced like wp_complete. Returns the
-- applied (category, id) pairs. Rows are locked in one statement and
-- written in the next (see wp_release_instances).
CREATE OR REPLACE FUNCTION {{.S}}.wp_release(
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
    v_cat     text[] := '{}';
    v_ids     uuid[] := '{}';
    v_streams text[] := '{}';
    x_ids     uuid[];
    x_streams text[];
    x_parts   integer[];
    v_parts   integer[] := '{}';
    v_scats   text[] := '{}';
    v_tids    tid[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts) THEN
        RAISE EXCEPTION 'workpump: wp_release: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        v_tids := ARRAY(
            SELECT x.tid
              FROM (SELECT u.k, u.att FROM unnest(p_categories, p_ids, p_attempts) AS u(cat, k, att)
                     WHERE u.cat = '{{.Name}}' ORDER BY u.k) r
             CROSS JOIN LATERAL (
                SELECT t.ctid AS tid FROM {{$.S}}.{{.Table}} t
                 WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id
                   FOR UPDATE OF t) x);
        WITH up AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET instance_id = NULL, lease_expiry = NULL, attempts = t.attempts - 1
             WHERE t.ctid = ANY (v_tids)
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
        SELECT array_agg(up.k), array_agg(up.stream_id) FILTER (WHERE up.stream_id <> ''),
               array_agg(up.partition_number) FILTER (WHERE up.stream_id <> '')
          INTO x_ids, x_streams, x_parts FROM up;
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
