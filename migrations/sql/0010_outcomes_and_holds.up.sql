-- workpump schema, version 10: handler outcomes and streams held by a dead
-- letter.
--
-- wp_fail takes what each failure asks for: a failed attempt, no retry
-- (straight to the dead letters), or a snooze (run again later, the
-- attempt not counted); and whether a dead letter holds its stream. A held
-- row stays in its table, scheduled for HELD = 9999-12-31 00:00 UTC, a time
-- no schedule reaches (enqueue refuses it), so it is never due and the
-- later rows of its stream wait behind it; it is copied to the dead letters
-- for operators. A retry puts it back in its place, a discard removes it;
-- wp_purge keeps held dead letters. The old wp_fail is dropped: its
-- arguments are a prefix of the new one's, so callers of version 9 work on.

DROP FUNCTION {{.S}}.wp_fail(uuid, text[], uuid[], integer[], text[], bigint[], integer, bigint, bigint, timestamptz);

-- wp_is_held reports whether the row p_id of category p_category is held:
-- dead-lettered under the hold policy and kept in its table, never due, so
-- that the later rows of its stream wait.
CREATE FUNCTION {{.S}}.wp_is_held(p_category text, p_id uuid) RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
    SELECT CASE p_category
{{- range .Cats}}
        WHEN '{{.Name}}' THEN EXISTS (SELECT 1 FROM {{$.S}}.{{.Table}} t
                                      WHERE t.{{.Key}} = p_id AND t.scheduled_for = '9999-12-31 00:00:00+00'::timestamptz
                                        AND t.{{.Done}} IS NULL AND t.instance_id IS NULL)
{{- end}}
        ELSE false END
$fn$;

-- wp_holds_stream reports whether dead letter p_dead_letter_id (of item
-- p_id in p_category) holds its stream: its item is held, and it is the
-- item's latest dead letter (an older one is from an earlier death, before
-- the id was enqueued again).
CREATE FUNCTION {{.S}}.wp_holds_stream(p_category text, p_id uuid, p_dead_letter_id bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
    SELECT {{.S}}.wp_is_held(p_category, p_id)
           AND NOT EXISTS (SELECT 1 FROM {{.S}}.wp_dead_letters x
                            WHERE x.category = p_category AND x.id = p_id AND x.dead_letter_id > p_dead_letter_id)
$fn$;

-- wp_held_streams lists the streams held by a dead letter, oldest first:
-- the held row's category, stream, id, name and the dead letter's error and
-- time. At most p_limit rows; p_limit <= 0 means all.
CREATE FUNCTION {{.S}}.wp_held_streams(p_limit integer)
RETURNS TABLE (category text, stream_id text, id uuid, name text, error text, dead_lettered_at timestamptz)
LANGUAGE sql STABLE
AS $fn$
    SELECT h.category, h.stream_id, h.id, h.name, d.error, d.dead_lettered_at
      FROM (
{{- range $i, $c := .Cats}}{{if $i}}
        UNION ALL{{end}}
        SELECT '{{$c.Name}}'::text AS category, t.stream_id, t.{{$c.Key}} AS id, t.name, t.seq
          FROM {{$.S}}.{{$c.Table}} t
         WHERE t.scheduled_for = '9999-12-31 00:00:00+00'::timestamptz AND t.{{$c.Done}} IS NULL AND t.instance_id IS NULL
{{- end}}) h
      CROSS JOIN LATERAL (
        SELECT dl.dead_letter_id, dl.error, dl.dead_lettered_at FROM {{.S}}.wp_dead_letters dl
         WHERE dl.category = h.category AND dl.id = h.id
         ORDER BY dl.dead_letter_id DESC LIMIT 1) d
     ORDER BY d.dead_letter_id
     LIMIT CASE WHEN p_limit > 0 THEN p_limit END
$fn$;

-- wp_stats_held counts the held rows of each category (wp_stats counts
-- them as scheduled).
CREATE FUNCTION {{.S}}.wp_stats_held()
RETURNS TABLE (category text, held bigint)
LANGUAGE sql STABLE
AS $fn$
{{- range $i, $c := .Cats}}{{if $i}}
    UNION ALL{{end}}
    SELECT '{{.Name}}'::text, count(*)
      FROM {{$.S}}.{{.Table}} t
     WHERE t.scheduled_for = '9999-12-31 00:00:00+00'::timestamptz AND t.{{.Done}} IS NULL AND t.instance_id IS NULL
{{- end}}
$fn$;

-- wp_fail records failed attempts, fenced by wp_lock_held like wp_complete
-- (only unexpired leases). p_kinds says what each failure asks for ('' or
-- NULL: a failed attempt; 'permanent': no retry; 'snooze': run again after
-- its retry_after, the attempt not counted). A failed attempt whose
-- attempts >= p_max_attempts, and a permanent one, is dead-lettered: the
-- row moves to wp_dead_letters with its error, or, when its p_hold is set
-- and it has a stream, it is copied there and stays in its table, held
-- (scheduled for HELD, a time no schedule reaches), so the later rows of
-- its stream wait until an operator retries or discards it. Any other
-- failure clears the lease, stores last_error and schedules the retry at
-- now + (retry_after when > 0, else wp_retry_delay(attempts, base, max)).
-- A snooze clears the lease, gives the attempt back (attempts - 1), keeps
-- last_error and schedules the row at now + retry_after. Returns (category,
-- id, dead) for every applied failure.
CREATE FUNCTION {{.S}}.wp_fail(
    p_instance_id    uuid,
    p_categories     text[],
    p_ids            uuid[],
    p_attempts       integer[],
    p_errors         text[],
    p_retry_after_ns bigint[],
    p_max_attempts   integer,
    p_base_ns        bigint,
    p_max_ns         bigint,
    p_now            timestamptz DEFAULT NULL,
    p_kinds          text[] DEFAULT NULL,
    p_hold           boolean[] DEFAULT NULL)
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
    h_tid     tid[];
    h_err     text[];
    h_ids     uuid[];
    s_tid     tid[];
    s_after   bigint[];
    s_ids     uuid[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts)
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_errors) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_retry_after_ns) THEN
        RAISE EXCEPTION 'workpump: wp_fail: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts <= 0 OR p_base_ns IS NULL OR p_base_ns <= 0 OR p_max_ns IS NULL OR p_max_ns < p_base_ns THEN
        RAISE EXCEPTION 'workpump: wp_fail: need p_max_attempts > 0 and 0 < p_base_ns <= p_max_ns' USING ERRCODE = '22023';
    END IF;
    IF (p_kinds IS NOT NULL AND cardinality(p_kinds) IS DISTINCT FROM cardinality(p_ids))
       OR (p_hold IS NOT NULL AND cardinality(p_hold) IS DISTINCT FROM cardinality(p_ids)) THEN
        RAISE EXCEPTION 'workpump: wp_fail: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_kinds, p_retry_after_ns) AS u(kind, after_ns)
                WHERE COALESCE(u.kind, '') NOT IN ('', 'permanent', 'snooze')
                   OR (u.kind = 'snooze' AND COALESCE(u.after_ns, 0) <= 0)) THEN
        RAISE EXCEPTION 'workpump: wp_fail: p_kinds: want , permanent or snooze (a snooze with a retry_after > 0)' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        -- Lock the held attempts with unexpired leases (wp_lock_held), then
        -- split them into dead letters and retries (tid-addressed, so no
        -- plan depends on how many rows the arrays hold).
        WITH lk AS (
            SELECT h.tid, h.k, h.attempts, h.stream_id, h.partition_number,
                   COALESCE(p_errors[h.pos], '') AS err, p_retry_after_ns[h.pos] AS after_ns,
                   CASE WHEN p_kinds[h.pos] = 'snooze' THEN 's'
                        WHEN p_kinds[h.pos] = 'permanent' OR h.attempts >= p_max_attempts THEN
                             CASE WHEN p_hold[h.pos] AND h.stream_id <> '' THEN 'h' ELSE 'd' END
                        ELSE 'r' END AS how
              FROM {{$.S}}.wp_lock_held('{{.Name}}', p_instance_id, p_categories, p_ids, p_attempts, v_now) h)
        SELECT array_agg(lk.tid) FILTER (WHERE lk.how = 'd'),
               array_agg(lk.err) FILTER (WHERE lk.how = 'd'),
               array_agg(lk.k) FILTER (WHERE lk.how = 'd'),
               array_agg(lk.tid) FILTER (WHERE lk.how = 'r'),
               array_agg(lk.err) FILTER (WHERE lk.how = 'r'),
               array_agg(lk.after_ns) FILTER (WHERE lk.how = 'r'),
               array_agg(lk.k) FILTER (WHERE lk.how = 'r'),
               array_agg(lk.tid) FILTER (WHERE lk.how = 'h'),
               array_agg(lk.err) FILTER (WHERE lk.how = 'h'),
               array_agg(lk.k) FILTER (WHERE lk.how = 'h'),
               array_agg(lk.tid) FILTER (WHERE lk.how = 's'),
               array_agg(lk.after_ns) FILTER (WHERE lk.how = 's'),
               array_agg(lk.k) FILTER (WHERE lk.how = 's'),
               array_agg(lk.stream_id) FILTER (WHERE lk.stream_id <> ''),
               array_agg(lk.partition_number) FILTER (WHERE lk.stream_id <> '')
          INTO d_tid, d_err, d_ids, r_tid, r_err, r_after, r_ids, h_tid, h_err, h_ids, s_tid, s_after, s_ids, x_streams, x_parts
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
        IF h_tid IS NOT NULL THEN
            WITH hd AS (
                UPDATE {{$.S}}.{{.Table}} t
                   SET instance_id = NULL, lease_expiry = NULL, last_error = h.err, scheduled_for = '9999-12-31 00:00:00+00'::timestamptz
                  FROM unnest(h_tid, h_err) AS h(tid, err)
                 WHERE t.ctid = h.tid
                RETURNING t.*, h.err AS dl_error)
            INSERT INTO {{$.S}}.wp_dead_letters
                (category, id, stream_id, partition_number, name, message_type, payload, metadata, attempts, seq,
                 scheduled_for, created_at, instance_id, error, dead_lettered_at)
            SELECT '{{.Name}}', hd.{{.Key}}, hd.stream_id, hd.partition_number, hd.name, hd.message_type, hd.payload,
                   hd.metadata, hd.attempts, hd.seq, NULL, hd.created_at, p_instance_id, hd.dl_error, v_now
              FROM hd
             ORDER BY hd.seq;
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(h_ids)]);
            v_ids := v_ids || h_ids;
            v_dead := v_dead || array_fill(true, ARRAY[cardinality(h_ids)]);
        END IF;
        IF s_tid IS NOT NULL THEN
            UPDATE {{$.S}}.{{.Table}} t
               SET instance_id = NULL, lease_expiry = NULL, attempts = t.attempts - 1,
                   scheduled_for = v_now + {{$.S}}.wp_ns(s.after_ns)
              FROM unnest(s_tid, s_after) AS s(tid, after_ns)
             WHERE t.ctid = s.tid;
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(s_ids)]);
            v_ids := v_ids || s_ids;
            v_dead := v_dead || array_fill(false, ARRAY[cardinality(s_ids)]);
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

-- wp_purge removes history: processed rows (inbox dedupe records) processed
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
        DELETE FROM {{.S}}.wp_active_streams a
         WHERE a.stream_id IN (
            SELECT s.stream_id FROM {{.S}}.wp_active_streams s
             WHERE s.lease_expiry IS NULL OR s.lease_expiry < v_now - {{.S}}.wp_ns(p_streams_ns)
               FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_s = ROW_COUNT;
        -- Lock rows of streams without ownership carry no state; drop the
        -- ones nobody holds (the next enqueue or claim recreates them).
        DELETE FROM {{.S}}.wp_stream_locks l
         WHERE l.stream_id IN (
            SELECT k.stream_id FROM {{.S}}.wp_stream_locks k
             WHERE NOT EXISTS (SELECT 1 FROM {{.S}}.wp_active_streams a WHERE a.stream_id = k.stream_id)
               FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY SELECT v_p, v_d, v_s;
END
$fn$;

-- wp_act_on_dead_letters retries or discards them, or counts them.

-- wp_find_dead_letters returns the dead letters that match every non-NULL
-- filter argument, numbered after p_after, in number order, at most
-- p_limit. p_error matches a substring of the error, ignoring case;
-- p_since <= dead_lettered_at < p_until.
CREATE OR REPLACE FUNCTION {{.S}}.wp_find_dead_letters(
    p_category text,
    p_name     text,
    p_stream   text,
    p_error    text,
    p_since    timestamptz,
    p_until    timestamptz,
    p_ids      uuid[],
    p_after    bigint,
    p_limit    integer)
RETURNS TABLE (
    dead_letter_id   bigint,
    category         text,
    id               uuid,
    stream_id        text,
    partition_number integer,
    name             text,
    message_type     text,
    payload          bytea,
    metadata         json,
    attempts         integer,
    seq              bigint,
    scheduled_for    timestamptz,
    created_at       timestamptz,
    error            text,
    dead_lettered_at timestamptz)
LANGUAGE sql STABLE
AS $fn$
    SELECT d.dead_letter_id, d.category, d.id, d.stream_id, d.partition_number, d.name, d.message_type, d.payload,
           d.metadata, d.attempts, d.seq, d.scheduled_for, d.created_at, d.error, d.dead_lettered_at
      FROM {{.S}}.wp_dead_letters d
     WHERE d.dead_letter_id > COALESCE(p_after, 0)
       AND (p_category IS NULL OR d.category = p_category)
       AND (p_name IS NULL OR d.name = p_name)
       AND (p_stream IS NULL OR d.stream_id = p_stream)
       AND (p_error IS NULL OR strpos(lower(d.error), lower(p_error)) > 0)
       AND (p_since IS NULL OR d.dead_lettered_at >= p_since)
       AND (p_until IS NULL OR d.dead_lettered_at < p_until)
       AND (p_ids IS NULL OR d.id = ANY (p_ids))
     ORDER BY d.dead_letter_id
     LIMIT p_limit
$fn$;

-- wp_act_on_dead_letters retries (p_action 'retry') or discards
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
             USING {{$.S}}.wp_dead_letters d
             WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}' AND t.{{.Key}} = d.id
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
               last_error = 'retried from the dead letters after ' || d.attempts || ' attempt(s); it had failed with: ' || d.error
          FROM {{$.S}}.wp_dead_letters d
         WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}' AND t.{{.Key}} = d.id;
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
           SET last_error = 'retried from the dead letters after ' || d.attempts || ' attempt(s); it had failed with: ' || d.error
          FROM {{$.S}}.wp_dead_letters d
         WHERE d.dead_letter_id = ANY (v_go) AND d.category = '{{.Name}}' AND t.{{.Key}} = d.id;
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
