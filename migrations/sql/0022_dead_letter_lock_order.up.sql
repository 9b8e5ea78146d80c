-- workpump schema, version 22: dead-letter actions lock their streams in
-- one stream order.
--
-- A retry of dead letters ran held items again in their place, locking
-- their streams, and then enqueued the others again, locking theirs: two
-- sorted passes, which together are not one order. While it waited for a
-- stream of the second pass it held streams of the first, and an enqueue
-- to streams of both (locked in one sorted pass) could hold the stream the
-- retry waited for and wait for one the retry held. Now every stream an
-- action writes to is locked in one call (wp_enqueue_prepare) before any
-- row is written, as one enqueue to them locks them. That call, like an
-- enqueue, locks the lock rows that exist in stream order and then
-- creates and locks the missing ones, so while a lock row is created
-- beside it (a stream's first enqueue, or the first after a purge) it can
-- still deadlock with an enqueue, as two enqueues can; the drivers run an
-- action Postgres rolled back again.

-- wp_act_on_dead_letters (version 22: streams locked once, in stream order)
-- retries
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
-- which locks the stream and notifies as an enqueue does). An action locks
-- every stream it writes to in one call, before it writes a row, as one
-- enqueue to those streams does: a retry that locked held streams and then
-- re-enqueued ones would hold the first while it waits for the second.
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
            PERFORM {{.S}}.wp_enqueue_prepare(array_agg(d.category), array_agg(d.stream_id), array_agg(d.partition_number),
                                              array_agg(NULL::timestamptz), v_now)
               FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_unhold);
{{- range .Cats}}
            DELETE FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = ANY (ARRAY(
                       SELECT d.id FROM {{$.S}}.wp_dead_letters d
                        WHERE d.dead_letter_id = ANY (v_unhold) AND d.category = '{{.Name}}'))
               AND t.scheduled_for = '9999-12-31 00:00:00+00'::timestamptz AND t.{{.Done}} IS NULL AND t.instance_id IS NULL;
{{- end}}
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
    IF cardinality(v_unhold) > 0 OR cardinality(v_go) > 0 THEN
        -- The streams of both kinds, locked in one stream order.
        PERFORM {{.S}}.wp_enqueue_prepare(array_agg(d.category), array_agg(d.stream_id), array_agg(d.partition_number),
                                          array_agg(NULL::timestamptz), v_now)
           FROM {{.S}}.wp_dead_letters d WHERE d.dead_letter_id = ANY (v_unhold) OR d.dead_letter_id = ANY (v_go);
    END IF;
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
    END IF;
    v_keep := ARRAY(SELECT u.dl FROM unnest(r_dl, r_in_use) AS u(dl, in_use) WHERE u.in_use);
    v_n := cardinality(v_go);
    IF v_n > 0 THEN
        -- In number order, so a stream's retried items keep their order
        -- (their streams are locked already).
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
