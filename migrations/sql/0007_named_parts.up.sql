-- workpump schema, version 7: the long functions in named parts.
--
-- wp_fail and wp_release share their fence, the lock of the attempts the
-- caller holds, as one function, wp_lock_held. wp_claim_work keeps its
-- signature and its steps, now numbered, and calls two named parts:
-- wp_claim_streams (lock the candidates' streams and take their ownership)
-- and wp_claim_lock_rows (the general path's lock step). The behaviour of
-- every function is version 6's.

-- wp_lock_held locks the rows of category p_category that p_instance_id
-- holds at the attempts named by the parallel arrays (p_categories, p_ids,
-- p_attempts; elements of other categories are ignored), in key order, and
-- returns each with the 1-based position of its element in the arrays.
-- With p_live_at set, a row whose lease ran out before p_live_at is not
-- held (wp_fail: a peer may hold an earlier row of its stream by then);
-- with NULL the lease's expiry is not looked at (wp_release). This is the
-- fence of wp_fail and wp_release: a row not returned is reported lost.
CREATE FUNCTION {{.S}}.wp_lock_held(
    p_category    text,
    p_instance_id uuid,
    p_categories  text[],
    p_ids         uuid[],
    p_attempts    integer[],
    p_live_at     timestamptz)
RETURNS TABLE (pos integer, tid tid, k uuid, attempts integer, stream_id text, partition_number integer)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
{{- range .Cats}}
    IF p_category = '{{.Name}}' THEN
        RETURN QUERY
        SELECT f.pos::integer, x.tid, x.k, x.attempts, x.stream_id, x.partition_number
          FROM (SELECT u.k, u.att, u.pos
                  FROM unnest(p_categories, p_ids, p_attempts) WITH ORDINALITY AS u(cat, k, att, pos)
                 WHERE u.cat = '{{.Name}}' ORDER BY u.k) f
         CROSS JOIN LATERAL (
            SELECT t.ctid AS tid, t.{{.Key}} AS k, t.attempts, t.stream_id, t.partition_number FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = f.k AND t.attempts = f.att AND t.instance_id = p_instance_id
               AND (p_live_at IS NULL OR (t.lease_expiry >= p_live_at) IS TRUE)
               FOR UPDATE OF t) x;
        RETURN;
    END IF;
{{- end}}
    RAISE EXCEPTION 'workpump: wp_lock_held: unknown category %', p_category USING ERRCODE = 'WP002';
END
$fn$;

-- wp_release clears the leases of attempts the caller never ran and gives
-- the attempt back (attempts - 1), fenced by wp_lock_held (lease expiry not
-- checked). Returns the applied (category, id) pairs. Rows are locked in
-- one statement and written in the next (see wp_release_instances).
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
        v_tids := ARRAY(SELECT h.tid FROM {{$.S}}.wp_lock_held('{{.Name}}', p_instance_id, p_categories, p_ids, p_attempts, NULL) h);
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

-- wp_fail records failed attempts, fenced by wp_lock_held like wp_complete
-- (only unexpired leases). A failure whose attempts >= p_max_attempts moves
-- the row to wp_dead_letters with its error; any other clears the lease,
-- stores last_error and schedules the retry at now + (retry_after when > 0,
-- else wp_retry_delay(attempts, base, max)). Returns (category, id, dead)
-- for every applied failure.
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
        -- Lock the held attempts with unexpired leases (wp_lock_held), then
        -- split them into dead letters and retries (tid-addressed, so no
        -- plan depends on how many rows the arrays hold).
        WITH lk AS (
            SELECT h.tid, h.k, h.attempts, h.stream_id, h.partition_number,
                   COALESCE(p_errors[h.pos], '') AS err, p_retry_after_ns[h.pos] AS after_ns
              FROM {{$.S}}.wp_lock_held('{{.Name}}', p_instance_id, p_categories, p_ids, p_attempts, v_now) h)
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

-- wp_claim_streams is step 5 of wp_claim_work: it locks the streams
-- p_streams (partitions p_parts) and makes p_instance_id the owner, with
-- stream lease p_exp, of each it locked that no other live instance owns
-- with a lease unexpired at p_now. It returns the streams the caller owns
-- now; a stream it skipped (locked by an open enqueue or a concurrent
-- claim) or could not take is not among them. The locks are held to the
-- end of the caller's transaction.
CREATE FUNCTION {{.S}}.wp_claim_streams(
    p_instance_id uuid,
    p_streams     text[],
    p_parts       integer[],
    p_now         timestamptz,
    p_exp         timestamptz)
RETURNS text[]
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_locked text[];
    v_exist  text[]; -- locked streams that have an ownership row
    v_owned  text[] := '{}';
BEGIN
        -- Lock the streams (an open enqueue or a concurrent claim of a
        -- stream makes us skip it), then take ownership of those not owned
        -- by another live instance with an unexpired stream lease.
        -- Existing lock rows first; then the missing ones are created (a
        -- row this claim inserts is its own until commit). A row locked by
        -- someone else conflicts and is skipped, like a SKIP LOCKED row.
        v_locked := ARRAY(
            SELECT l.stream_id FROM {{.S}}.wp_stream_locks l
             WHERE l.stream_id = ANY (p_streams)
             ORDER BY l.stream_id
               FOR UPDATE SKIP LOCKED);
        IF cardinality(v_locked) < cardinality(p_streams) THEN
            WITH ins AS (
                INSERT INTO {{.S}}.wp_stream_locks (stream_id)
                SELECT s FROM unnest(p_streams) s
                 WHERE s NOT IN (SELECT unnest(v_locked))
                 ORDER BY s COLLATE "C"
                ON CONFLICT (stream_id) DO NOTHING
                RETURNING stream_id)
            SELECT v_locked || COALESCE(array_agg(ins.stream_id), '{}') INTO v_locked FROM ins;
        END IF;
        -- An owner counts as gone only when its instance row is gone on the
        -- statement's own snapshot: the live set read at the start misses a
        -- peer that registered since, and that peer may own the stream by now.
        -- Ownership: existing rows are updated, missing ones inserted
        -- plainly (cheaper than an upsert's speculative insertion).
        -- Only a claimer holding a stream's lock row inserts its ownership
        -- row, and this claim has held all of v_locked since before these
        -- statements' snapshots, so no row can appear meanwhile. A row that
        -- a settle deleted meanwhile is neither updated nor inserted here;
        -- the upsert below takes such streams, so the outcome is the
        -- upsert's in every case.
        v_exist := ARRAY(SELECT a.stream_id FROM {{.S}}.wp_active_streams a WHERE a.stream_id = ANY (v_locked));
        IF cardinality(v_exist) > 0 THEN
            WITH up AS (
                UPDATE {{.S}}.wp_active_streams a
                   SET assigned_instance_id = p_instance_id, lease_expiry = p_exp
                 WHERE a.stream_id = ANY (v_exist)
                   AND (a.assigned_instance_id IS NULL OR a.assigned_instance_id = p_instance_id
                        OR a.lease_expiry < p_now
                        OR NOT EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i
                                        WHERE i.instance_id = a.assigned_instance_id))
                RETURNING a.stream_id)
            SELECT COALESCE(array_agg(up.stream_id), '{}') INTO v_owned FROM up;
        END IF;
        WITH ins AS (
            INSERT INTO {{.S}}.wp_active_streams (stream_id, assigned_instance_id, lease_expiry, partition_number)
            SELECT x.s, p_instance_id, p_exp, x.part FROM unnest(p_streams, p_parts) AS x(s, part)
             WHERE x.s IN (SELECT unnest(v_locked)) AND x.s NOT IN (SELECT unnest(v_exist))
             ORDER BY x.s COLLATE "C"
            RETURNING stream_id)
        SELECT v_owned || COALESCE(array_agg(ins.stream_id), '{}') INTO v_owned FROM ins;
        IF cardinality(v_owned) < cardinality(v_locked) THEN
            WITH up AS (
                INSERT INTO {{.S}}.wp_active_streams AS a (stream_id, assigned_instance_id, lease_expiry, partition_number)
                SELECT x.s, p_instance_id, p_exp, x.part FROM unnest(p_streams, p_parts) AS x(s, part)
                 WHERE x.s IN (SELECT unnest(v_locked)) AND x.s NOT IN (SELECT unnest(v_owned))
                 ORDER BY x.s COLLATE "C"
                ON CONFLICT (stream_id) DO UPDATE
                   SET assigned_instance_id = EXCLUDED.assigned_instance_id, lease_expiry = EXCLUDED.lease_expiry,
                       partition_number = EXCLUDED.partition_number
                 WHERE a.assigned_instance_id IS NULL OR a.assigned_instance_id = p_instance_id
                    OR a.lease_expiry < p_now
                    OR NOT EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i
                                    WHERE i.instance_id = a.assigned_instance_id)
                RETURNING a.stream_id)
            SELECT v_owned || COALESCE(array_agg(up.stream_id), '{}') INTO v_owned FROM up;
        END IF;
    RETURN v_owned;
END
$fn$;

-- wp_claim_lock_rows is the lock step of wp_claim_work's general path for
-- category p_category: given the candidates (parallel arrays of ids, ctids,
-- seqs, streams and scope names, in seq order), the streams the claim owns
-- (p_owned; p_every when that is all of them) and the claim's time, it
-- locks the candidates that can still be taken and returns their ctids,
-- leaving out every candidate after a missing one of its order scope. It
-- returns NULL when none can be taken.
CREATE FUNCTION {{.S}}.wp_claim_lock_rows(
    p_category text,
    p_ids      uuid[],
    p_tids     tid[],
    p_seqs     bigint[],
    p_streams  text[],
    p_names    text[],
    p_every    boolean,
    p_owned    text[],
    p_now      timestamptz)
RETURNS tid[]
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_tids tid[];
    v_got  uuid[];
BEGIN
{{- range .Cats}}
    IF p_category = '{{.Name}}' THEN
        -- Take all candidates, except those of skipped streams.
        -- Re-check and lock them under a fresh snapshot, by ctid (a row
        -- updated meanwhile is followed to its latest version and
        -- re-checked; the key test, pairwise through the join, guards
        -- against a ctid reused by another row; an "= ANY (ids)" test
        -- would compare every row with every id).
        WITH lk AS (
            SELECT t.ctid AS tid, t.{{.Key}} AS k
              FROM unnest(p_tids, p_ids, p_streams) AS c(tid, k, stream_id)
              JOIN {{$.S}}.{{.Table}} t ON t.ctid = c.tid
             WHERE t.{{.Key}} = c.k
               AND (p_every OR c.stream_id = '' OR c.stream_id IN (SELECT unnest(p_owned)))
               AND t.{{.Done}} IS NULL
               AND (t.instance_id IS NULL OR t.lease_expiry < p_now)
               AND (t.scheduled_for IS NULL OR t.scheduled_for <= p_now)
               FOR UPDATE OF t SKIP LOCKED)
        SELECT array_agg(lk.tid), array_agg(lk.k) INTO v_tids, v_got FROM lk;
        IF cardinality(v_got) IS DISTINCT FROM cardinality(p_ids) AND v_got IS NOT NULL THEN
            -- Some candidate cannot be taken (or its stream was
            -- skipped): keep a locked row only if no earlier candidate
            -- of its scope is missing.
            v_tids := ARRAY(
                SELECT g.tid
                  FROM (SELECT c.k, c.seq, c.stream_id, c.sname, l.tid,
                               min(c.seq) FILTER (WHERE l.tid IS NULL) OVER (PARTITION BY c.stream_id, c.sname) AS gap
                          FROM unnest(p_ids, p_seqs, p_streams, p_names) AS c(k, seq, stream_id, sname)
                          LEFT JOIN unnest(v_got, v_tids) AS l(k, tid) ON l.k = c.k) g
                 WHERE g.tid IS NOT NULL AND (g.stream_id = '' OR g.gap IS NULL OR g.seq < g.gap));
        END IF;
        RETURN v_tids;
    END IF;
{{- end}}
    RAISE EXCEPTION 'workpump: wp_claim_lock_rows: unknown category %', p_category USING ERRCODE = 'WP002';
END
$fn$;

-- wp_claim_work leases claimable rows to p_instance_id and returns them,
-- grouped by category (outbox, inbox, perspective_event, receptor); within a
-- category the order is the update's, and the drivers sort by seq. The rules are the driver package's:
--  * claimable: pending AND (unowned OR lease_expiry < now) AND due;
--  * routing: a stream owned by a live instance with stream lease >= now is
--    claimed only by that owner; any other row only by the instance whose
--    rank (0-based position by instance_id) equals partition mod live count;
--  * order: a row is taken only if no earlier pending row of its order scope
--    is leased (lease >= now) or scheduled in the future, and every earlier
--    claimable row of the scope is taken in the same call;
--  * at most p_max rows per category; attempts+1, claim_count+1 (orphaned
--    when the row had been claimed before), lease = now+lease; each stream a
--    row is taken from gets owner = caller, stream lease = now+lease.
-- Nothing claimable means nothing written: cheap probes on the partial
-- indexes decide first, and every write comes after candidates exist.
-- Order safety under races: after choosing candidates (one snapshot), their
-- stream lock rows are locked FOR UPDATE SKIP LOCKED (a concurrent claimer or
-- an open enqueue of the stream makes this claim skip the stream; enqueues of
-- a stream are serialized, so rows committed after the snapshot come after
-- every candidate in seq), then the rows are re-checked under a new snapshot,
-- and a candidate that can no longer be taken drops every later candidate of
-- its scope. Between the candidate read and the stream locks a peer may have
-- claimed a stream and failed, released or kept its rows: every decision
-- made after the locks (who owns a stream, which candidates are still
-- fresh) is made on the new snapshot, never on the first one.
-- The steps are numbered in the body; steps 5 and 6 call wp_claim_streams
-- and wp_claim_lock_rows.
-- Plans avoid joins between array-derived sets (their row estimates are
-- guesses): per-row lookups are correlated index probes, and the common
-- paths (every stream locked, every row locked) skip the gap bookkeeping.
CREATE OR REPLACE FUNCTION {{.S}}.wp_claim_work(
    p_instance_id uuid,
    p_categories  text[],
    p_lease_ns    bigint,
    p_max         integer,
    p_now         timestamptz DEFAULT NULL)
RETURNS TABLE (
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
    lease_expiry     timestamptz,
    orphaned         boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := COALESCE(p_now, now());
    v_exp      timestamptz;
    v_rank     integer;
    v_live     integer;
    v_live_ids uuid[];
    v_found    boolean;
    v_streams  text[];
    v_owned    text[] := '{}';
    v_mine     text[]; -- streams the caller owns outside its rank
    v_klo      integer := 0;     -- the caller's fresh rows: rank keys in
    v_khi      integer := 32768; -- [v_klo, v_khi), partition mod 3 in
    v_m3lo     integer := 0;     -- [v_m3lo, v_m3hi] and mod 5 in
    v_m3hi     integer := 2;     -- [v_m5lo, v_m5hi] (by default every
    v_m5lo     integer := 0;     -- rank's rows: see wp_rank_key)
    v_m5hi     integer := 4;
    v_pow2     integer;          -- the largest power of two dividing v_live
    v_odd      integer;          -- v_live / v_pow2
    v_sparts   integer[]; -- partitions of v_streams
    v_strays   boolean := false; -- a peer owns a stream outside its rank
    v_all      boolean;
    v_every    boolean; -- every candidate's stream is locked and owned
    v_fast     boolean; -- ... and every candidate is still a fresh row
    v_tids     tid[];
{{- range .Cats}}
    v_{{.Name}}     boolean;
    c_{{.Name}}_id     uuid[];
    c_{{.Name}}_tid    tid[];
    c_{{.Name}}_seq    bigint[];
    c_{{.Name}}_stream text[];
    c_{{.Name}}_part   integer[];
    c_{{.Name}}_name   text[];
    c_{{.Name}}_fresh  boolean; -- every candidate came from the fresh index
{{- end}}
BEGIN
    -- 1. Arguments, registration, and the idle short-circuit: nothing
    --    claimable returns before anything is read twice or written.
    IF p_lease_ns IS NULL OR p_lease_ns <= 0 THEN
        RAISE EXCEPTION 'workpump: wp_claim_work: p_lease_ns must be > 0' USING ERRCODE = '22023';
    END IF;
    IF p_max IS NULL OR p_max <= 0 THEN
        RAISE EXCEPTION 'workpump: wp_claim_work: p_max must be > 0' USING ERRCODE = '22023';
    END IF;
    v_exp := v_now + {{.S}}.wp_ns(p_lease_ns);
    v_all := p_categories IS NULL OR cardinality(p_categories) = 0;
    IF NOT v_all AND NOT (p_categories <@ ARRAY[{{.CatList}}]) THEN
        RAISE EXCEPTION 'workpump: wp_claim_work: unknown category in p_categories' USING ERRCODE = 'WP002';
    END IF;

    -- Registration check and idle short-circuit in one statement: one index
    -- probe per claim source and category. The fresh probe is an ordered
    -- LIMIT 1 so that it always walks the partial index (a seq scan would
    -- read every leased row first).
    SELECT EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id),
{{- range $i, $c := .Cats}}{{if $i}},{{end}}
        (v_all OR '{{.Name}}' = ANY (p_categories)) AND (
            (SELECT t.seq FROM {{$.S}}.{{.Table}} t
              WHERE t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL
              ORDER BY t.seq LIMIT 1) IS NOT NULL
         OR EXISTS (SELECT 1 FROM {{$.S}}.{{.Table}} t
                     WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                       AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now))
{{- end}}
      INTO v_found, {{range $i, $c := .Cats}}{{if $i}}, {{end}}v_{{.Name}}{{end}};
    IF NOT v_found THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;
    IF NOT ({{range $i, $c := .Cats}}{{if $i}} OR {{end}}v_{{.Name}}{{end}}) THEN
        RETURN;
    END IF;

    -- 2. Routing: the live set, the caller's rank, and the streams owned
    --    outside their owner's rank.
    SELECT array_agg(i.instance_id ORDER BY i.instance_id) INTO v_live_ids FROM {{.S}}.wp_service_instances i;
    v_rank := array_position(v_live_ids, p_instance_id) - 1;
    v_live := cardinality(v_live_ids);
    IF v_rank IS NULL THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;
    -- Streams owned outside their owner's rank (left from before the live
    -- set changed), in one pass over the (small: in-flight streams only)
    -- table: the caller's (v_mine; a row outside the caller's rank is
    -- claimable only through them) and whether a live peer holds any (only
    -- then can a row of the caller's rank belong to a peer's stream). The
    -- pass saves an ownership probe per row the claim looks at. When the
    -- caller has none and the live count is 2^k times 1, 3, 5 or 15, the
    -- fresh rows to look at are its rank's key range and residues (see
    -- wp_rank_key).
    IF v_live > 1 THEN
        SELECT COALESCE(array_agg(a.stream_id) FILTER (WHERE a.assigned_instance_id = p_instance_id), '{}'),
               COALESCE(bool_or(a.assigned_instance_id <> p_instance_id), false)
          INTO v_mine, v_strays
          FROM {{.S}}.wp_active_streams a
         -- (an owner that is not live counts too: a needless probe at worst)
         WHERE a.lease_expiry >= v_now
           AND (v_live_ids[a.partition_number % v_live + 1] = a.assigned_instance_id) IS NOT TRUE;
        v_pow2 := v_live & -v_live;
        v_odd := v_live / v_pow2;
        IF cardinality(v_mine) = 0 AND v_pow2 <= 32768 AND v_odd IN (1, 3, 5, 15) THEN
            v_klo := {{.S}}.wp_rank_key(v_rank % v_pow2);
            v_khi := v_klo + 32768 / v_pow2;
            IF v_odd % 3 = 0 THEN
                v_m3lo := v_rank % 3;
                v_m3hi := v_m3lo;
            END IF;
            IF v_odd % 5 = 0 THEN
                v_m5lo := v_rank % 5;
                v_m5hi := v_m5lo;
            END IF;
        END IF;
    ELSE
        v_mine := '{}';
    END IF;

    -- 3. Candidates, per category, on the function's first snapshot.
{{range .Cats}}
    IF v_{{.Name}} THEN
        -- Candidates: the first p_max claimable rows by seq that route to the
        -- caller and are not blocked in their scope. Sources are merged by
        -- seq: fresh rows (index order), and waiting rows whose schedule is
        -- due or whose lease expired (few; sorted).
        SELECT array_agg(w.k ORDER BY w.seq), array_agg(w.tid ORDER BY w.seq), array_agg(w.seq ORDER BY w.seq),
               array_agg(w.stream_id ORDER BY w.seq), array_agg(w.sname ORDER BY w.seq), bool_and(w.fresh),
               array_agg(w.partition_number ORDER BY w.seq)
          INTO c_{{.Name}}_id, c_{{.Name}}_tid, c_{{.Name}}_seq, c_{{.Name}}_stream, c_{{.Name}}_name, c_{{.Name}}_fresh,
               c_{{.Name}}_part
          FROM (
            SELECT u.k, u.tid, u.seq, u.stream_id, u.sname, u.fresh, u.partition_number
              FROM (
                (SELECT t.{{.Key}} AS k, t.ctid AS tid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}} AS sname, t.partition_number,
                        true AS fresh
                   FROM {{$.S}}.{{.Table}} t
                  WHERE t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL
                    AND {{$.S}}.wp_rank_key(t.partition_number) >= v_klo
                    AND {{$.S}}.wp_rank_key(t.partition_number) < v_khi
                    AND (t.partition_number % 3)::smallint BETWEEN v_m3lo AND v_m3hi
                    AND (t.partition_number % 5)::smallint BETWEEN v_m5lo AND v_m5hi
                  ORDER BY t.seq)
                UNION ALL
                (SELECT t.{{.Key}}, t.ctid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}}, t.partition_number, false
                   FROM {{$.S}}.{{.Table}} t
                  WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                    AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now
                    AND (t.instance_id IS NULL OR t.lease_expiry < v_now)
                    AND (t.scheduled_for IS NULL OR t.scheduled_for <= v_now)
                  ORDER BY t.seq)
              ) u
             WHERE CASE WHEN u.stream_id = '' THEN u.partition_number % v_live = v_rank
                   ELSE CASE WHEN u.partition_number % v_live = v_rank
                             -- (a peer owns a stream of the caller's rank only
                             -- if it owns a stream outside its own: v_strays)
                             THEN NOT v_strays OR NOT EXISTS (
                                    SELECT 1 FROM {{$.S}}.wp_active_streams a
                                     WHERE a.stream_id = u.stream_id AND a.lease_expiry >= v_now
                                       AND a.assigned_instance_id <> p_instance_id
                                       AND (a.assigned_instance_id = ANY (v_live_ids)) IS TRUE)
                             ELSE u.stream_id IN (SELECT unnest(v_mine))
                        END
                        AND NOT EXISTS (
                          SELECT 1 FROM {{$.S}}.{{.Table}} b
                           WHERE b.stream_id = u.stream_id{{if .ByName}} AND b.name = u.sname{{end}} AND b.seq < u.seq
                             AND b.{{.Done}} IS NULL AND b.stream_id <> ''
                             AND (b.instance_id IS NOT NULL OR b.scheduled_for IS NOT NULL)
                             AND ((b.instance_id IS NOT NULL AND b.lease_expiry >= v_now) OR b.scheduled_for > v_now))
                   END
             ORDER BY u.seq
             LIMIT p_max) w;
    END IF;
{{end}}
    -- 4. Candidates found: the pause point, then the instance row's
    --    key-share lock before the first write.
    IF {{range $i, $c := .Cats}}{{if $i}} AND {{end}}c_{{.Name}}_id IS NULL{{end}} THEN
        RETURN;
    END IF;
    -- Test sessions (workpump.pause_points = on) can be held here, between
    -- the candidate read and the stream locks, while a peer runs.
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('claim.after_candidates', p_instance_id);
    END IF;

    -- From here on the claim writes. Key-share lock our instance row so a
    -- concurrent cleanup (which skips locked rows) cannot evict us mid-claim.
    PERFORM 1 FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;

    -- 5. Streams: the candidates' distinct streams with their partitions,
    --    in no order (each statement that locks or writes by stream sorts
    --    for itself; two aggregates of one input stay parallel; a hashed
    --    grouping is cheaper than the sorted form), locked and taken by
    --    wp_claim_streams.
    SELECT COALESCE(array_agg(g.s), '{}'), COALESCE(array_agg(g.part), '{}')
      INTO v_streams, v_sparts
      FROM (SELECT u.s, min(u.part) AS part
              FROM unnest({{range $i, $c := .Cats}}{{if $i}} || {{end}}COALESCE(c_{{.Name}}_stream, '{}'){{end}},
                          {{range $i, $c := .Cats}}{{if $i}} || {{end}}COALESCE(c_{{.Name}}_part, '{}'){{end}}) AS u(s, part)
             WHERE u.s <> ''
             GROUP BY u.s) g;
    IF cardinality(v_streams) > 0 THEN
        v_owned := {{.S}}.wp_claim_streams(p_instance_id, v_streams, v_sparts, v_now, v_exp);
    END IF;

    -- 6. Rows, per category: the fast path when every candidate is still
    --    fresh and every stream is owned, else the general path, whose
    --    lock step is wp_claim_lock_rows.
{{range .Cats}}
    IF c_{{.Name}}_id IS NOT NULL THEN
        v_every := cardinality(v_owned) = cardinality(v_streams);
        v_fast := v_every AND c_{{.Name}}_fresh;
        IF v_fast THEN
            -- Every candidate was fresh on the first snapshot, but a peer
            -- may have claimed one of its streams before this claim locked
            -- it, and failed, released or kept a row: that row is no longer
            -- the version read (or no longer fresh), and taking the rows
            -- after it would break its stream's order. Count the candidates
            -- that are still fresh on a new snapshot (by ctid, so a row
            -- updated since is not found); all of them, or the general path.
            SELECT count(*) = cardinality(c_{{.Name}}_id) INTO v_fast
              FROM {{$.S}}.{{.Table}} t
             WHERE t.ctid = ANY (c_{{.Name}}_tid)
               AND (t.{{.Key}} IN (SELECT unnest(c_{{.Name}}_id))) IS TRUE
               AND (t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL) IS TRUE;
        END IF;
        IF v_fast THEN
            -- Fast path: every candidate is still a fresh row and every
            -- stream is locked and owned. Nobody else changes a fresh row of
            -- a locked stream (other claimers need the stream lock; acks,
            -- renewals and cleanup touch leased rows only), so no candidate
            -- can drop out and leave a gap: update them directly, without
            -- the lock step. A fresh streamless row another claimer (after a
            -- rank change) took meanwhile fails the re-check and is left
            -- out; it carries no order. The key test (a hashed set: IS TRUE
            -- keeps it from becoming a join) guards against a reused ctid.
            RETURN QUERY
            UPDATE {{$.S}}.{{.Table}} t
               SET instance_id = p_instance_id, lease_expiry = v_exp,
                   attempts = t.attempts + 1, claim_count = t.claim_count + 1
             WHERE t.ctid = ANY (c_{{.Name}}_tid)
               AND (t.{{.Key}} IN (SELECT unnest(c_{{.Name}}_id))) IS TRUE
               -- (IS TRUE: spelled plainly, this re-check matches the fresh
               -- index's predicate, and the planner walks that whole index.)
               AND (t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL) IS TRUE
            RETURNING '{{.Name}}'::text, t.{{.Key}}, t.stream_id, t.partition_number, t.name, t.message_type,
                      t.payload, t.metadata, t.attempts, t.seq, t.scheduled_for, t.created_at, t.lease_expiry,
                      t.claim_count > 1;
        ELSE
            -- General path: lock what can still be taken, keeping no row
            -- after a missing one of its scope (see wp_claim_lock_rows).
            v_tids := {{$.S}}.wp_claim_lock_rows('{{.Name}}', c_{{.Name}}_id, c_{{.Name}}_tid, c_{{.Name}}_seq,
                                                 c_{{.Name}}_stream, c_{{.Name}}_name, v_every, v_owned, v_now);
            IF cardinality(v_tids) > 0 THEN
                -- Unsorted: the drivers order the rows by seq (cheaper there).
                RETURN QUERY
                UPDATE {{$.S}}.{{.Table}} t
                   SET instance_id = p_instance_id, lease_expiry = v_exp,
                       attempts = t.attempts + 1, claim_count = t.claim_count + 1
                 WHERE t.ctid = ANY (v_tids)
                RETURNING '{{.Name}}'::text, t.{{.Key}}, t.stream_id, t.partition_number, t.name, t.message_type,
                          t.payload, t.metadata, t.attempts, t.seq, t.scheduled_for, t.created_at, t.lease_expiry,
                          t.claim_count > 1;
            END IF;
        END IF;
    END IF;
{{end}}
END
$fn$;

