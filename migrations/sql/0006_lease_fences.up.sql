-- workpump schema, version 6: lease fences hold under concurrent writers.
--
-- wp_release_instances (deregistration and eviction), wp_renew_leases and
-- wp_release locked their rows and wrote them in one statement, addressing
-- them by ctid. A row whose lock had to be waited for (a renewal committing
-- meanwhile) is then a newer version than the statement's snapshot sees, so
-- the write skipped it: a deregistered instance kept a lease, and a release
-- reported an attempt lost that it still held. Each now locks in one
-- statement and writes in the next. A renewal no longer revives a lease that
-- ran out, nor shortens a stream's lease; Complete and Fail no longer apply
-- an attempt whose lease ran out.

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

{{/* Appends one category's settled rows (x_streams, x_parts) to the
arguments of wp_settle_streams (v_streams, v_parts, v_scats). */}}
{{- define "settleCollect"}}
            IF x_streams IS NOT NULL THEN
                v_streams := v_streams || x_streams;
                v_parts := v_parts || x_parts;
                v_scats := v_scats || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_streams)]);
            END IF;
{{- end}}
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

-- wp_fail records failed attempts (fenced like wp_complete). A failure whose
-- attempts >= p_max_attempts moves the row to wp_dead_letters with its error;
-- any other clears the lease, stores last_error and schedules the retry at
-- now + (retry_after when > 0, else wp_retry_delay(attempts, base, max)).
-- Returns (category, id, dead) for every applied failure.
CREATE OR REPLACE FUNCTION {{.S}}.wp_fail(
    p_instance_id    uuid,
    p_categories     text[],
    p_ids            uuid[],
    p_attempts       integer[],
    p_errors         text[],
    p_retry_after_ns bigint[],
    p_max_attempts   integer,
    p_base_ns        bigint,
    p_max_ns         bigint,
    p_now            timestamptz DEFAULT NULL)
RETURNS TABLE (category text, id uuid, dead boolean)
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
    v_dead    boolean[] := '{}';
    v_streams text[] := '{}';
    x_streams text[];
    x_parts   integer[];
    v_parts   integer[] := '{}';
    v_scats   text[] := '{}';
    d_tid     tid[];
    d_err     text[];
    d_ids     uuid[];
    r_tid     tid[];
    r_err     text[];
    r_after   bigint[];
    r_ids     uuid[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts)
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_errors) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_retry_after_ns) THEN
        RAISE EXCEPTION 'workpump: wp_fail: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts <= 0 OR p_base_ns IS NULL OR p_base_ns <= 0 OR p_max_ns IS NULL OR p_max_ns < p_base_ns THEN
        RAISE EXCEPTION 'workpump: wp_fail: need p_max_attempts > 0 and 0 < p_base_ns <= p_max_ns' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        -- Lock the held attempts in key order, then split them into dead
        -- letters and retries (tid-addressed, so no plan depends on how
        -- many rows the arrays hold).
        WITH lk AS (
            SELECT x.tid, x.k, x.attempts, x.stream_id, x.partition_number, f.err, f.after_ns
              FROM (SELECT u.k, u.att, COALESCE(u.err, '') AS err, u.after_ns
                      FROM unnest(p_categories, p_ids, p_attempts, p_errors, p_retry_after_ns) AS u(cat, k, att, err, after_ns)
                     WHERE u.cat = '{{.Name}}' ORDER BY u.k) f
             CROSS JOIN LATERAL (
                SELECT t.ctid AS tid, t.{{.Key}} AS k, t.attempts, t.stream_id, t.partition_number FROM {{$.S}}.{{.Table}} t
                 WHERE t.{{.Key}} = f.k AND t.attempts = f.att AND t.instance_id = p_instance_id
                   AND (t.lease_expiry >= v_now) IS TRUE
                   FOR UPDATE OF t) x)
        SELECT array_agg(lk.tid) FILTER (WHERE lk.attempts >= p_max_attempts),
               array_agg(lk.err) FILTER (WHERE lk.attempts >= p_max_attempts),
               array_agg(lk.k) FILTER (WHERE lk.attempts >= p_max_attempts),
               array_agg(lk.tid) FILTER (WHERE lk.attempts < p_max_attempts),
               array_agg(lk.err) FILTER (WHERE lk.attempts < p_max_attempts),
               array_agg(lk.after_ns) FILTER (WHERE lk.attempts < p_max_attempts),
               array_agg(lk.k) FILTER (WHERE lk.attempts < p_max_attempts),
               array_agg(lk.stream_id) FILTER (WHERE lk.stream_id <> ''),
               array_agg(lk.partition_number) FILTER (WHERE lk.stream_id <> '')
          INTO d_tid, d_err, d_ids, r_tid, r_err, r_after, r_ids, x_streams, x_parts
          FROM lk;
        IF d_tid IS NOT NULL THEN
            WITH dl AS (
                DELETE FROM {{$.S}}.{{.Table}} t
                 USING unnest(d_tid, d_err) AS d(tid, err)
                 WHERE t.ctid = d.tid
                RETURNING t.*, d.err AS dl_error)
            INSERT INTO {{$.S}}.wp_dead_letters
                (category, id, stream_id, partition_number, name, message_type, payload, metadata, attempts, seq,
                 scheduled_for, created_at, instance_id, error, dead_lettered_at)
            SELECT '{{.Name}}', dl.{{.Key}}, dl.stream_id, dl.partition_number, dl.name, dl.message_type, dl.payload,
                   dl.metadata, dl.attempts, dl.seq, dl.scheduled_for, dl.created_at, p_instance_id, dl.dl_error, v_now
              FROM dl
             ORDER BY dl.seq;
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(d_ids)]);
            v_ids := v_ids || d_ids;
            v_dead := v_dead || array_fill(true, ARRAY[cardinality(d_ids)]);
        END IF;
        IF r_tid IS NOT NULL THEN
            UPDATE {{$.S}}.{{.Table}} t
               SET instance_id = NULL, lease_expiry = NULL, last_error = r.err,
                   scheduled_for = v_now + CASE WHEN r.after_ns > 0 THEN {{$.S}}.wp_ns(r.after_ns)
                                               ELSE {{$.S}}.wp_retry_delay(t.attempts, p_base_ns, p_max_ns) END
              FROM unnest(r_tid, r_err, r_after) AS r(tid, err, after_ns)
             WHERE t.ctid = r.tid;
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(r_ids)]);
            v_ids := v_ids || r_ids;
            v_dead := v_dead || array_fill(false, ARRAY[cardinality(r_ids)]);
        END IF;
            IF x_streams IS NOT NULL THEN
                v_streams := v_streams || x_streams;
                v_parts := v_parts || x_parts;
                v_scats := v_scats || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_streams)]);
            END IF;
    END IF;
{{- end}}
    IF cardinality(v_streams) > 0 THEN
        PERFORM {{.S}}.wp_settle_streams(p_instance_id, v_streams, v_parts, v_scats);
    END IF;
    RETURN QUERY SELECT u.c, u.k, u.d FROM unnest(v_cat, v_ids, v_dead) AS u(c, k, d);
END
$fn$;
