-- workpump schema, version 11: cancelling work.
--
-- wp_cancel_work removes pending and leased rows by id or by stream.

-- wp_cancel_work removes the unprocessed rows of p_category (NULL: every
-- category) whose key is in p_ids, or whose stream is p_stream (exactly one
-- of the two is given). Held rows (dead letters that hold their stream) are
-- not touched: they belong to the dead-letter operations. A leased row is
-- removed too: its owner's renewals and acks are refused from then on (the
-- row is gone), and its stream's ownership is settled as a completion
-- would. The streams are locked first, as an enqueue locks them, so no
-- claim is handing out their rows meanwhile; their claimers are woken, so
-- the rows left behind a cancelled one run at once. When p_ids holds ids
-- that match no such row, it changes nothing and returns those ids with
-- outcome 'unknown'; otherwise it returns every removed row with outcome
-- 'cancelled' and whether it was leased. Test sessions
-- (workpump.pause_points = on) can be held after the rows are locked, at
-- cancel.after_lock (keyed by the nil instance id).
CREATE FUNCTION {{.S}}.wp_cancel_work(
    p_category text,
    p_ids      uuid[],
    p_stream   text,
    p_now      timestamptz DEFAULT NULL)
RETURNS TABLE (category text, id uuid, attempts integer, leased boolean, outcome text)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := COALESCE(p_now, now());
    v_cats    text[];
    v_streams text[];
    v_parts   integer[];
    r_cat     text[] := '{}';
    r_tid     tid[] := '{}';
    r_id      uuid[] := '{}';
    r_att     integer[] := '{}';
    r_inst    uuid[] := '{}';
    r_stream  text[] := '{}';
    r_part    integer[] := '{}';
    x_tid     tid[];
    x_id      uuid[];
    x_att     integer[];
    x_inst    uuid[];
    x_stream  text[];
    x_part    integer[];
    v_owner   uuid;
    v_bad     integer;
BEGIN
    IF (p_ids IS NULL) = (p_stream IS NULL) THEN
        RAISE EXCEPTION 'workpump: wp_cancel_work: give p_ids or p_stream, not both' USING ERRCODE = '22023';
    END IF;
    IF p_stream = '' THEN
        RAISE EXCEPTION 'workpump: wp_cancel_work: p_stream is empty' USING ERRCODE = '22023';
    END IF;
    IF p_category IS NOT NULL AND p_category NOT IN ({{.CatList}}) THEN
        RAISE EXCEPTION 'workpump: wp_cancel_work: unknown category %', p_category USING ERRCODE = 'WP002';
    END IF;
    -- The streams of the matching rows, locked as an enqueue locks them
    -- (wp_enqueue_prepare, which also wakes their claimers at commit).
    SELECT array_agg(m.cat), array_agg(m.stream_id), array_agg(m.partition_number)
      INTO v_cats, v_streams, v_parts
      FROM (SELECT DISTINCT ON (u.cat, u.stream_id) u.cat, u.stream_id, u.partition_number
              FROM (
{{- range $i, $c := .Cats}}{{if $i}}
                UNION ALL{{end}}
                SELECT '{{$c.Name}}'::text AS cat, t.stream_id, t.partition_number
                  FROM {{$.S}}.{{$c.Table}} t
                 WHERE (p_category IS NULL OR p_category = '{{$c.Name}}') AND t.{{$c.Done}} IS NULL AND t.stream_id <> ''
                   AND (CASE WHEN p_ids IS NOT NULL THEN t.{{$c.Key}} = ANY (p_ids) ELSE t.stream_id = p_stream END)
{{- end}}) u
             ORDER BY u.cat, u.stream_id) m;
    IF v_streams IS NOT NULL THEN
        PERFORM {{.S}}.wp_enqueue_prepare(v_cats, v_streams, v_parts,
                                          array_fill(NULL::timestamptz, ARRAY[cardinality(v_streams)]), v_now);
    END IF;
{{- range .Cats}}
    IF p_category IS NULL OR p_category = '{{.Name}}' THEN
        SELECT array_agg(l.tid), array_agg(l.k), array_agg(l.attempts), array_agg(l.instance_id),
               array_agg(l.stream_id), array_agg(l.partition_number)
          INTO x_tid, x_id, x_att, x_inst, x_stream, x_part
          FROM (SELECT t.ctid AS tid, t.{{.Key}} AS k, t.attempts, t.instance_id, t.stream_id, t.partition_number
                  FROM {{$.S}}.{{.Table}} t
                 WHERE t.{{.Done}} IS NULL
                   AND (CASE WHEN p_ids IS NOT NULL THEN t.{{.Key}} = ANY (p_ids) ELSE t.stream_id = p_stream END)
                   AND NOT (t.instance_id IS NULL AND t.scheduled_for IS NOT DISTINCT FROM '9999-12-31 00:00:00+00'::timestamptz)
                 ORDER BY t.{{.Key}}
                   FOR UPDATE OF t) l;
        IF x_tid IS NOT NULL THEN
            r_cat := r_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_tid)]);
            r_tid := r_tid || x_tid;
            r_id := r_id || x_id;
            r_att := r_att || x_att;
            r_inst := r_inst || x_inst;
            r_stream := r_stream || x_stream;
            r_part := r_part || x_part;
        END IF;
    END IF;
{{- end}}
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('cancel.after_lock', '00000000-0000-0000-0000-000000000000'::uuid);
    END IF;
    IF p_ids IS NOT NULL THEN
        RETURN QUERY
        SELECT ''::text, u.id, 0, false, 'unknown'::text
          FROM (SELECT DISTINCT x.id FROM unnest(p_ids) AS x(id)) u
         WHERE u.id <> ALL (r_id);
        GET DIAGNOSTICS v_bad = ROW_COUNT;
        IF v_bad > 0 THEN
            RETURN;
        END IF;
    END IF;
{{- range .Cats}}
    DELETE FROM {{$.S}}.{{.Table}} t
     WHERE t.ctid = ANY (ARRAY(SELECT u.tid FROM unnest(r_cat, r_tid) AS u(cat, tid) WHERE u.cat = '{{.Name}}'));
{{- end}}
    -- Streams whose leased rows went: their owners give them up as a
    -- completion would.
    FOR v_owner IN SELECT DISTINCT u.inst FROM unnest(r_inst, r_stream) AS u(inst, s) WHERE u.inst IS NOT NULL AND u.s <> '' LOOP
        PERFORM {{.S}}.wp_settle_streams(v_owner,
            ARRAY(SELECT u.s FROM unnest(r_inst, r_stream) AS u(inst, s) WHERE u.inst = v_owner AND u.s <> ''),
            ARRAY(SELECT u.part FROM unnest(r_inst, r_stream, r_part) AS u(inst, s, part) WHERE u.inst = v_owner AND u.s <> ''),
            ARRAY(SELECT u.cat FROM unnest(r_inst, r_stream, r_cat) AS u(inst, s, cat) WHERE u.inst = v_owner AND u.s <> ''));
    END LOOP;
    RETURN QUERY
    SELECT u.cat, u.id, u.att, u.inst IS NOT NULL, 'cancelled'::text
      FROM unnest(r_cat, r_id, r_att, r_inst) AS u(cat, id, att, inst);
END
$fn$;
