-- workpump schema, version 21: writes reach their rows by key.
--
-- Some statements wrote rows of a table through a join with a list of
-- rows: the renewal's and the release's writes of stream ownership rows
-- (joined to the rows a sub-select had locked), the completion's delete
-- (joined to the completed ids), the dead-letter actions' writes of held
-- and retried rows (joined to the dead letters) and the purge's deletes of
-- ownership and lock rows (a semi-join with the rows a sub-select locked).
-- A function plans on the table's statistics of that moment (those with
-- plan_cache_mode = force_generic_plan keep the plan for the session), and
-- a table's statistics say it is empty after a vacuum that found it empty
-- (a drained queue, or the ownership table between bursts). Then the
-- planner put the table outside the join and read the whole list once per
-- row of the table: a renewal of a thousand streams beside a few thousand
-- owned ones read millions of rows, and a deregistration ran for seconds
-- while its snapshot kept every later dead row from being vacuumed, which
-- made it slower still.
--
-- Now each of those writes reaches its table by key: rows locked in one
-- statement are written by key in the next (= ANY of an array), the
-- completion finds its rows by key (= ANY of the ids, through the primary
-- key's index in key order, bitmap scans off for that statement) with the
-- attempt fence as a hashed test of (id, attempts) pairs (IS TRUE keeps it
-- from becoming a join), and the dead-letter actions find the rows of work by key and read each row's
-- dead letter by a lookup from that row. Each such write reads the rows it
-- writes, whatever the statistics say. Rows are still locked in key order
-- where they were.

-- wp_renew_leases (version 21: stream rows written by key) sets
-- lease_expiry = now+lease on the rows of p_ids that are
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
    v_locked  text[];
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
        -- Locked in one statement, written by key in the next (see the
        -- header).
        v_locked := ARRAY(
            SELECT s.stream_id FROM {{.S}}.wp_active_streams s
             WHERE s.stream_id = ANY (v_streams) AND (s.assigned_instance_id = p_instance_id) IS TRUE
             ORDER BY s.stream_id
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE {{.S}}.wp_active_streams a
           SET lease_expiry = GREATEST(a.lease_expiry, v_exp)
         WHERE a.stream_id = ANY (v_locked);
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

-- wp_complete (version 21: rows found by key alone) completes handed-out
-- attempts (parallel arrays category, id,
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
    v_bitmap  text := current_setting('enable_bitmapscan');
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts) THEN
        RAISE EXCEPTION 'workpump: wp_complete: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        -- The rows are found by an index scan, which visits the keys in
        -- order, so they are locked in key order as every other writer
        -- locks them (a bitmap scan would lock them in table order). The
        -- setting is in force while this statement is planned (its plan is
        -- kept) and set back before the settle below plans its own.
        PERFORM set_config('enable_bitmapscan', 'off', true);
        WITH r AS MATERIALIZED (
            SELECT u.k, u.att FROM unnest(p_categories, p_ids, p_attempts) AS u(cat, k, att)
             WHERE u.cat = '{{.Name}}' ORDER BY u.k),
{{- if .Keeps}}
        d AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET {{.Done}} = v_now, instance_id = NULL, lease_expiry = NULL
             WHERE t.{{.Key}} = ANY (ARRAY(SELECT r.k FROM r))
               AND ((t.{{.Key}}, t.attempts) IN (SELECT r.k, r.att FROM r)) IS TRUE
               AND t.instance_id = p_instance_id AND (t.lease_expiry >= v_now) IS TRUE
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- else}}
        d AS (
            DELETE FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = ANY (ARRAY(SELECT r.k FROM r))
               AND ((t.{{.Key}}, t.attempts) IN (SELECT r.k, r.att FROM r)) IS TRUE
               AND t.instance_id = p_instance_id AND (t.lease_expiry >= v_now) IS TRUE
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- end}}
        SELECT array_agg(d.k), array_agg(d.stream_id) FILTER (WHERE d.stream_id <> ''),
               array_agg(d.partition_number) FILTER (WHERE d.stream_id <> '')
          INTO x_ids, x_streams, x_parts FROM d;
        PERFORM set_config('enable_bitmapscan', v_bitmap, true);
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

-- wp_release_instances (version 21: stream rows written by key) clears every
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
    v_streams text[];
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
    -- Stream rows: locked in one statement, written by key in the next.
    v_streams := ARRAY(
        SELECT s.stream_id FROM {{.S}}.wp_active_streams s
         WHERE s.assigned_instance_id = ANY (p_ids)
         ORDER BY s.stream_id
           FOR NO KEY UPDATE);
    UPDATE {{.S}}.wp_active_streams a
       SET assigned_instance_id = NULL, lease_expiry = NULL
     WHERE a.stream_id = ANY (v_streams);
    RETURN v_n;
END
$fn$;

-- wp_purge (version 21: the locked rows deleted by key) removes history: processed rows (inbox dedupe records) processed
-- before now - p_processed_ns, dead letters older than now - p_dead_ns, and
-- stream ownership rows whose lease ended before now - p_streams_ns (released
-- streams have no lease and always qualify), with the idle lock rows of
-- unowned streams. A null or zero age skips that purge. Rows locked by an
-- open enqueue or claim are skipped. A dead letter that holds its stream
-- (its row held in its table) is kept: only a retry or a discard ends it.
CREATE OR REPLACE FUNCTION {{.S}}.wp_purge(
    p_processed_ns bigint,
    p_dead_ns      bigint,
    p_streams_ns   bigint,
    p_now          timestamptz DEFAULT NULL)
RETURNS TABLE (processed integer, dead_letters integer, streams integer)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz := COALESCE(p_now, now());
    v_p   integer := 0;
    v_d   integer := 0;
    v_s   integer := 0;
    v_c   integer;
    v_gone text[];
BEGIN
    IF p_processed_ns > 0 THEN
{{- range .Cats}}{{if .Keeps}}
        DELETE FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Done}} IS NOT NULL AND t.{{.Done}} < v_now - {{$.S}}.wp_ns(p_processed_ns);
        GET DIAGNOSTICS v_c = ROW_COUNT;
        v_p := v_p + v_c;
{{- end}}{{end}}
    END IF;
    IF p_dead_ns > 0 THEN
        DELETE FROM {{.S}}.wp_dead_letters d
         WHERE d.dead_lettered_at < v_now - {{.S}}.wp_ns(p_dead_ns)
           AND NOT {{.S}}.wp_holds_stream(d.category, d.id, d.dead_letter_id);
        GET DIAGNOSTICS v_d = ROW_COUNT;
    END IF;
    IF p_streams_ns > 0 THEN
        v_gone := ARRAY(
            SELECT s.stream_id FROM {{.S}}.wp_active_streams s
             WHERE s.lease_expiry IS NULL OR s.lease_expiry < v_now - {{.S}}.wp_ns(p_streams_ns)
               FOR UPDATE SKIP LOCKED);
        DELETE FROM {{.S}}.wp_active_streams a WHERE a.stream_id = ANY (v_gone);
        GET DIAGNOSTICS v_s = ROW_COUNT;
        -- Lock rows of streams without ownership carry no state; drop the
        -- ones nobody holds (the next enqueue or claim recreates them).
        v_gone := ARRAY(
            SELECT k.stream_id FROM {{.S}}.wp_stream_locks k
             WHERE NOT EXISTS (SELECT 1 FROM {{.S}}.wp_active_streams a WHERE a.stream_id = k.stream_id)
               FOR UPDATE SKIP LOCKED);
        DELETE FROM {{.S}}.wp_stream_locks l WHERE l.stream_id = ANY (v_gone);
    END IF;
    RETURN QUERY SELECT v_p, v_d, v_s;
END
$fn$;

-- wp_act_on_dead_letters (version 21: rows of work found by key) retries
-- (p_action 'retry') or discards
-- ('discard') the dead letters that match the filter (as
-- wp_find_dead_letters'), or with p_dry_run only counts them. It returns
-- one row per dead letter it matched, with its outcome:
--  * 'matched' (dry run), 'retried', 'discarded';
--  * 'superseded' (retry): removed, an older dead letter of an id whose
--    latest one was retried;
--  * 'in_use' (retry): left in place, its id is held by a row of its
--    category again;
--  * 'unknown', 'live' (p_ids): the id is no dead letter, unknown or held
--    by a row of the category returned. The call then changes nothing and
--    returns only these rows.
-- A retry enqueues each dead letter again through wp_enqueue (its stream
-- locked, its owner woken): a new ready row at the end of its stream with
-- the same id, zero attempts and a last_error that says it was retried.
-- A dead letter that holds its stream is retried in its place instead: its
-- held row becomes ready with zero attempts, the first of its stream again.
-- A discard of one removes its held row too, and the rest of its stream
-- goes on. Either wakes the stream's claimer (through wp_enqueue_prepare,
-- which locks the stream and notifies as an enqueue does).
-- When one id has several dead letters in a category, the latest is
-- retried and all are removed. The matched dead letters are locked first,
-- so a concurrent action on one of them waits, then finds it gone. Test
-- sessions (workpump.pause_points = on) can be held right after those
-- locks, at dead_letters.after_lock (keyed by the nil instance id).
CREATE OR REPLACE FUNCTION {{.S}}.wp_act_on_dead_letters(
    p_action   text,
    p_category text,
    p_name     text,
    p_stream   text,
    p_error    text,
    p_since    timestamptz,
    p_until    timestamptz,
    p_ids      uuid[],
    p_dry_run  boolean,
    p_now      timestamptz DEFAULT NULL)
RETURNS TABLE (category text, id uuid, attempts integer, outcome text)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := COALESCE(p_now, now());
    v_rows     bigint[];
    v_bad      integer;
    v_n        integer;
    v_got      integer;
    v_go       bigint[];
    v_keep     bigint[];
    r_dl       bigint[];
    r_cat      text[];
    r_id       uuid[];
    r_att      integer[];
    r_in_use   boolean[];
    r_latest   boolean[];
    r_held     boolean[];
    r_held_row boolean[];
    v_unhold   bigint[];
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('retry', 'discard') THEN
        RAISE EXCEPTION 'workpump: wp_act_on_dead_letters: unknown action %', p_action USING ERRCODE = '22023';
    END IF;
    IF p_category IS NOT NULL AND p_category NOT IN ({{.CatList}}) THEN
        RAISE EXCEPTION 'workpump: wp_act_on_dead_letters: unknown category %', p_category USING ERRCODE = 'WP002';
    END IF;
    -- Lock the matching dead letters (in number order, so two actions
    -- cannot deadlock); rows a concurrent action removed drop out.
    v_rows := ARRAY(
        SELECT d.dead_letter_id
          FROM {{.S}}.wp_dead_letters d
         WHERE (p_category IS NULL OR d.category = p_category)
           AND (p_name IS NULL OR d.name = p_name)
           AND (p_stream IS NULL OR d.stream_id = p_stream)
           AND (p_error IS NULL OR strpos(lower(d.error), lower(p_error)) > 0)
           AND (p_since IS NULL OR d.dead_lettered_at >= p_since)
           AND (p_until IS NULL OR d.dead_lettered_at < p_until)
           AND (p_ids IS NULL OR d.id = ANY (p_ids))
         ORDER BY d.dead_letter_id
           FOR UPDATE);
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('dead_letters.after_lock', '00000000-0000-0000-0000-000000000000'::uuid);
    END IF;
    IF p_ids IS NOT NULL THEN
        -- Every id asked for must be a dead letter (after the locks: one a
        -- concurrent action removed counts as not one).
        RETURN QUERY
        SELECT COALESCE(lv.cat, ''), u.id, 0, CASE WHEN lv.cat IS NULL THEN 'unknown' ELSE 'live' END
          FROM (SELECT DISTINCT x.id FROM unnest(p_ids) AS x(id)) u
          LEFT JOIN LATERAL (
{{- range $i, $c := .Cats}}{{if $i}}
                UNION ALL{{end}}
                SELECT '{{$c.Name}}'::text AS cat FROM {{$.S}}.{{$c.Table}} t
                 WHERE t.{{$c.Key}} = u.id AND (p_category IS NULL OR p_category = '{{$c.Name}}')
{{- end}}
                LIMIT 1) lv ON true
         WHERE NOT EXISTS (SELECT 1 FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_rows) AND d.id = u.id);
        GET DIAGNOSTICS v_bad = ROW_COUNT;
        IF v_bad > 0 THEN
            RETURN;
        END IF;
    END IF;
    IF p_dry_run THEN
        RETURN QUERY
        SELECT d.category, d.id, d.attempts, 'matched'::text
          FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_rows) ORDER BY d.dead_letter_id;
        RETURN;
    END IF;
    IF p_action = 'discard' THEN
        -- Held rows of the discarded dead letters go too, and their
        -- streams go on.
        v_unhold := ARRAY(SELECT d.dead_letter_id FROM {{.S}}.wp_dead_letters d
                           WHERE d.dead_letter_id = ANY (v_rows) AND {{.S}}.wp_holds_stream(d.category, d.id, d.dead_letter_id));
        IF cardinality(v_unhold) > 0 THEN
{{- range .Cats}}
            DELETE FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = ANY (ARRAY(
                       SELECT d.id FROM {{$.S}}.wp_dead_letters d
                        WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}'))
               AND t.scheduled_for = '9999-12-31 00:00:00+00'::timestamptz AND t.{{.Done}} IS NULL AND t.instance_id IS NULL;
{{- end}}
            PERFORM {{.S}}.wp_enqueue_prepare(array_agg(d.category), array_agg(d.stream_id), array_agg(d.partition_number),
                                              array_agg(NULL::timestamptz), v_now)
               FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_unhold);
        END IF;
        RETURN QUERY
        WITH del AS (
            DELETE FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_rows)
            RETURNING d.dead_letter_id, d.category, d.id, d.attempts)
        SELECT del.category, del.id, del.attempts, 'discarded'::text FROM del ORDER BY del.dead_letter_id;
        RETURN;
    END IF;
    -- Retry. Dead letters whose id a row of their category holds again
    -- stay; of the others, the latest per id is enqueued again.
    SELECT array_agg(x.dl ORDER BY x.dl), array_agg(x.cat ORDER BY x.dl), array_agg(x.id ORDER BY x.dl),
           array_agg(x.att ORDER BY x.dl), array_agg(x.in_use ORDER BY x.dl), array_agg(x.latest ORDER BY x.dl),
           array_agg(x.held ORDER BY x.dl), array_agg(x.held_row ORDER BY x.dl)
      INTO r_dl, r_cat, r_id, r_att, r_in_use, r_latest, r_held, r_held_row
      FROM (SELECT d.dead_letter_id AS dl, d.category AS cat, d.id, d.attempts AS att,
                   CASE d.category
{{- range .Cats}}
                       WHEN '{{.Name}}' THEN EXISTS (SELECT 1 FROM {{$.S}}.{{.Table}} t WHERE t.{{.Key}} = d.id)
{{- end}}
                   END AND NOT {{.S}}.wp_is_held(d.category, d.id) AS in_use,
                   {{.S}}.wp_holds_stream(d.category, d.id, d.dead_letter_id) AS held,
                   {{.S}}.wp_is_held(d.category, d.id) AS held_row,
                   d.dead_letter_id = max(d.dead_letter_id) OVER (PARTITION BY d.category, d.id) AS latest
              FROM {{.S}}.wp_dead_letters d
             WHERE d.dead_letter_id = ANY (v_rows)) x;
    -- An older dead letter of a held item is only removed: the hold is
    -- its latest dead letter's.
    v_go := ARRAY(SELECT u.dl FROM unnest(r_dl, r_in_use, r_latest, r_held_row) AS u(dl, in_use, latest, held_row)
                   WHERE u.latest AND NOT u.in_use AND NOT u.held_row ORDER BY u.dl);
    v_unhold := ARRAY(SELECT u.dl FROM unnest(r_dl, r_held) AS u(dl, held)
                       WHERE u.held ORDER BY u.dl);
    IF cardinality(v_unhold) > 0 THEN
        -- Held rows run again in their place: the first of their streams.
{{- range .Cats}}
        UPDATE {{$.S}}.{{.Table}} t
           SET scheduled_for = NULL, attempts = 0,
               last_error = (SELECT 'retried from the dead letters after ' || d.attempts || ' attempt(s); it had failed with: ' || d.error
                               FROM {{$.S}}.wp_dead_letters d
                              WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}' AND d.id = t.{{.Key}}
                              ORDER BY d.dead_letter_id DESC LIMIT 1)
         WHERE t.{{.Key}} = ANY (ARRAY(
                   SELECT d.id FROM {{$.S}}.wp_dead_letters d
                    WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}'));
{{- end}}
        PERFORM {{.S}}.wp_enqueue_prepare(array_agg(d.category), array_agg(d.stream_id), array_agg(d.partition_number),
                                          array_agg(NULL::timestamptz), v_now)
           FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_unhold);
    END IF;
    v_keep := ARRAY(SELECT u.dl FROM unnest(r_dl, r_in_use) AS u(dl, in_use) WHERE u.in_use);
    v_n := cardinality(v_go);
    IF v_n > 0 THEN
        -- In number order, so a stream's retried items keep their order.
        SELECT {{.S}}.wp_enqueue(
                   array_agg(d.category ORDER BY d.dead_letter_id), array_agg(d.id ORDER BY d.dead_letter_id),
                   array_agg(d.stream_id ORDER BY d.dead_letter_id), array_agg(d.partition_number ORDER BY d.dead_letter_id),
                   array_agg(d.name ORDER BY d.dead_letter_id), array_agg(d.message_type ORDER BY d.dead_letter_id),
                   array_agg(d.payload ORDER BY d.dead_letter_id), array_agg(d.metadata::text ORDER BY d.dead_letter_id),
                   array_agg(NULL::timestamptz ORDER BY d.dead_letter_id), v_now, false)
          INTO v_got
          FROM {{.S}}.wp_dead_letters d
         WHERE d.dead_letter_id = ANY (v_go);
        IF v_got IS DISTINCT FROM v_n THEN
            -- An item with one of these ids was enqueued after the check.
            RAISE EXCEPTION 'workpump: wp_act_on_dead_letters: an item with the id of a retried dead letter was enqueued meanwhile; nothing was retried, try again' USING ERRCODE = '40001';
        END IF;
{{- range .Cats}}
        UPDATE {{$.S}}.{{.Table}} t
           SET last_error = (SELECT 'retried from the dead letters after ' || d.attempts || ' attempt(s); it had failed with: ' || d.error
                               FROM {{$.S}}.wp_dead_letters d
                              WHERE d.dead_letter_id = ANY (v_go) AND d.category = '{{.Name}}' AND d.id = t.{{.Key}}
                              ORDER BY d.dead_letter_id DESC LIMIT 1)
         WHERE t.{{.Key}} = ANY (ARRAY(
                   SELECT d.id FROM {{$.S}}.wp_dead_letters d
                    WHERE d.dead_letter_id = ANY (v_go) AND d.category = '{{.Name}}'));
{{- end}}
    END IF;
    DELETE FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_rows) AND d.dead_letter_id <> ALL (v_keep);
    RETURN QUERY
    SELECT u.cat, u.id, u.att,
           CASE WHEN u.in_use THEN 'in_use' WHEN u.held THEN 'retried' WHEN u.held_row THEN 'superseded'
                WHEN u.latest THEN 'retried' ELSE 'superseded' END
      FROM unnest(r_dl, r_cat, r_id, r_att, r_in_use, r_latest, r_held, r_held_row)
           AS u(dl, cat, id, att, in_use, latest, held, held_row)
     ORDER BY u.dl;
END
$fn$;
