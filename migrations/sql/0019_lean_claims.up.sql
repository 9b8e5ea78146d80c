-- workpump schema, version 19: a claim writes and sorts less.
--
-- wp_claim_work read its candidates in seq order and then built each of
-- their arrays with an aggregate that sorted the rows by seq once more,
-- one sort per array. No step after the read depends on the arrays'
-- order: the stream and row locks, the re-check and the update work on
-- the candidates as a set, and the gap check of wp_claim_lock_rows
-- compares seqs. The arrays are still parallel (filled by one aggregation
-- over the same rows).
--
-- wp_claim_streams probed the ownership table for every stream a claim
-- takes, to lock and update the rows it found, and then inserted the
-- rest. A stream's ownership row goes when its owner settles the stream,
-- and a stream is claimable again only once its earlier rows are settled,
-- so the probe finds nothing in the common case. It now inserts first,
-- and takes the old steps only when the insert meets a row; after such a
-- claim the next claims on the same session probe first.
--
-- Only these two functions are replaced; the rules are version 18's.

-- wp_claim_streams (version 19: a plain insert first) is step 5 of
-- wp_claim_work: it locks the streams
-- p_streams (partitions p_parts) and makes p_instance_id the owner, with
-- stream lease p_exp, of each it locked that no other live instance owns
-- with a lease unexpired at p_now. It returns the streams the caller owns
-- now; a stream it skipped (locked by an open enqueue or a concurrent
-- claim) or could not take is not among them. The locks are held to the
-- end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{.S}}.wp_claim_streams(
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
    v_timeout text;  -- the caller's lock_timeout
    v_every   boolean; -- every stream of p_streams is locked
    v_left    text;    -- claims on this session to probe first
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
        -- The insert must not wait either: a lock row an open enqueue
        -- created (or a purge is deleting) makes it wait for that
        -- transaction, and the enqueue's next call in the same transaction
        -- may wait for a lock row this claim holds. So it runs with the
        -- shortest lock timeout, and if it would wait, every missing
        -- stream is skipped this time (the block's insert and setting are
        -- undone with it).
        IF cardinality(v_locked) < cardinality(p_streams) THEN
            v_timeout := current_setting('lock_timeout');
            BEGIN
                PERFORM set_config('lock_timeout', '1ms', true);
                WITH ins AS (
                    INSERT INTO {{.S}}.wp_stream_locks (stream_id)
                    SELECT s FROM unnest(p_streams) s
                     WHERE s NOT IN (SELECT unnest(v_locked))
                     ORDER BY s COLLATE "C"
                    ON CONFLICT (stream_id) DO NOTHING
                    RETURNING stream_id)
                SELECT v_locked || COALESCE(array_agg(ins.stream_id), '{}') INTO v_locked FROM ins;
                PERFORM set_config('lock_timeout', v_timeout, true);
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
        -- The common case first: none of the locked streams has an
        -- ownership row (a stream's row goes when its owner settles it,
        -- and a stream is claimable again only once its earlier rows are
        -- settled), so one plain insert takes them all, without first
        -- probing for rows to lock and update. Any row there makes the
        -- insert fail with a unique violation (a row deleted by a
        -- committed settle does not; one a settle is deleting is waited
        -- for, as the probe below would wait for it), and the block's
        -- subtransaction undoes what it inserted; the steps below then
        -- take the streams as they always did.
        -- Some workloads keep rows there between claims (a stream with
        -- rows in flight in another order scope: another category, or
        -- another perspective name), and then the insert fails most times,
        -- after inserting up to every stream that sorts before the first
        -- owned one. So a failure makes the next claims on this session
        -- probe first (workpump.claim_probes_left, a session setting and
        -- only a hint: its value changes no outcome), and the insert is
        -- tried again after them.
        v_left := COALESCE(current_setting('workpump.claim_probes_left', true), '');
        IF v_left ~ '^[0-9]{1,3}$' AND v_left::integer > 0 THEN
            PERFORM set_config('workpump.claim_probes_left', (v_left::integer - 1)::text, false);
        ELSIF cardinality(v_locked) > 0 THEN
            v_every := cardinality(v_locked) = cardinality(p_streams);
            -- (Sent only to a session that asks for debug messages: tests
            -- tell by it which way a claim went.)
            RAISE DEBUG 'workpump: claim: ownership insert first';
            BEGIN
                WITH ins AS (
                    INSERT INTO {{.S}}.wp_active_streams (stream_id, assigned_instance_id, lease_expiry, partition_number)
                    SELECT x.s, p_instance_id, p_exp, x.part FROM unnest(p_streams, p_parts) AS x(s, part)
                     WHERE v_every OR x.s IN (SELECT unnest(v_locked))
                     ORDER BY x.s COLLATE "C"
                    RETURNING stream_id)
                SELECT COALESCE(array_agg(ins.stream_id), '{}') INTO v_owned FROM ins;
                RETURN v_owned;
            EXCEPTION WHEN unique_violation THEN
                v_owned := '{}';
            END;
            PERFORM set_config('workpump.claim_probes_left', '16', false);
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
        -- The ownership rows are locked first, in stream order, as every
        -- other writer of them locks them (wp_settle_streams, the renewal,
        -- the release): the update below would lock them in the order it
        -- finds them, and a settle of the same streams (a Complete, Fail or
        -- Release of the owner, running beside the claim) could hold one
        -- and wait for another the update holds. A row deleted by a settle
        -- while this waited for it is not returned, so it is inserted anew.
        v_exist := ARRAY(SELECT a.stream_id FROM {{.S}}.wp_active_streams a
                          WHERE a.stream_id = ANY (v_locked)
                          ORDER BY a.stream_id
                            FOR NO KEY UPDATE);
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

-- wp_claim_work (version 19: candidates gathered unsorted) leases claimable rows to p_instance_id and returns them,
-- grouped by category (outbox, inbox, perspective_event, receptor); within a
-- category the order is the update's, and the drivers sort by seq. The rules are the driver package's:
--  * claimable: pending AND (unowned OR lease_expiry < now) AND due;
--  * routing: a stream owned by a live instance with stream lease >= now is
--    claimed only by that owner; any other row only by the instance whose
--    rank (0-based position by instance_id) is wp_rank_of(partition, live
--    count): the ranks divide the rank keys into equal ranges, in order;
--  * order: a row is taken only if no earlier pending row of its order scope
--    is leased (lease >= now) or scheduled in the future, and every earlier
--    claimable row of the scope is taken in the same call;
--  * pauses (wp_pauses, version 13): a paused category gives nothing; a
--    row of a paused name is not taken and blocks its order scope as a
--    future-scheduled row does. The pauses are read, and the table locked
--    shared, in the first statement, so wp_pause_work (which locks it
--    exclusively) waits for this call to return, and a call that starts
--    while a pause is being recorded reads it once it is committed;
--  * p_read (version 16), when not NULL, bounds each category's read: only
--    rows up to the seq of its p_read-th fresh row (in the caller's range
--    of the fresh index) are looked at, fresh or waiting, so the call
--    claims what an unbounded call would claim from a table that ended
--    there, and rows past the bound wait for a later call;
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
    p_now         timestamptz DEFAULT NULL,
    p_read        integer DEFAULT NULL)
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
    v_upto     bigint;  -- a category's candidates: seq <= v_upto (p_read)
    v_klo      integer := 0;     -- the fresh rows looked at: rank keys
    v_khi      integer := 32768; -- in [v_klo, v_khi) (by default all)
    v_mlo      integer;          -- the rank keys of the caller's streams
    v_mhi      integer;          -- in v_mine: [v_mlo, v_mhi]
    v_sparts   integer[]; -- partitions of v_streams
    v_strays   boolean := false; -- a peer owns a stream outside its rank
    v_all      boolean;
    v_every    boolean; -- every candidate's stream is locked and owned
    v_fast     boolean; -- ... and every candidate is still a fresh row
    v_tids     tid[];
    v_pcats    text[];  -- categories paused as a whole
    v_pnc      text[];  -- named pauses: their categories
    v_pnn      text[];  -- ... and their names
    v_left     integer; -- paused names' path: the candidates still wanted,
    v_cutoff   text[];  -- the streams cut at a paused row,
    v_batch    integer; -- the rows of the next batch,
    v_r        record;  -- the row read,
    v_b        record;  -- a batch's outcome (wp_cut_batch)
    x_id       uuid[];
    x_tid      tid[];
    x_seq      bigint[];
    x_stream   text[];
    x_name     text[];
    x_fresh    boolean[];
    x_part     integer[];
    x_nm       text[];
    x_n        integer;
{{- range .Cats}}
    v_{{.Name}}     boolean;
    c_{{.Name}}_id     uuid[];
    c_{{.Name}}_tid    tid[];
    c_{{.Name}}_seq    bigint[];
    c_{{.Name}}_stream text[];
    c_{{.Name}}_part   integer[];
    c_{{.Name}}_name   text[];
    c_{{.Name}}_fresh  boolean; -- every candidate came from the fresh index
    n_{{.Name}}        text[];  -- the category's paused names (NULL: none)
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
    IF p_read IS NOT NULL AND p_read <= 0 THEN
        RAISE EXCEPTION 'workpump: wp_claim_work: p_read must be > 0 or NULL' USING ERRCODE = '22023';
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
    -- The pauses are read here too (see the header).
    SELECT EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id),
           pz.cats, pz.ncats, pz.names,
{{- range $i, $c := .Cats}}{{if $i}},{{end}}
        (v_all OR '{{.Name}}' = ANY (p_categories)) AND NOT ('{{.Name}}' = ANY (COALESCE(pz.cats, '{}'))) AND (
            (SELECT t.seq FROM {{$.S}}.{{.Table}} t
              WHERE t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL
              ORDER BY t.seq LIMIT 1) IS NOT NULL
         OR EXISTS (SELECT 1 FROM {{$.S}}.{{.Table}} t
                     WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                       AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now))
{{- end}}
      INTO v_found, v_pcats, v_pnc, v_pnn, {{range $i, $c := .Cats}}{{if $i}}, {{end}}v_{{.Name}}{{end}}
      FROM (SELECT array_agg(p.category) FILTER (WHERE NOT p.named) AS cats,
                   array_agg(p.category) FILTER (WHERE p.named) AS ncats,
                   array_agg(p.name) FILTER (WHERE p.named) AS names
              FROM {{.S}}.wp_pauses p) pz;
    IF NOT v_found THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;
    IF NOT ({{range $i, $c := .Cats}}{{if $i}} OR {{end}}v_{{.Name}}{{end}}) THEN
        RETURN;
    END IF;
    IF v_pnc IS NOT NULL THEN
{{- range .Cats}}
        n_{{.Name}} := (SELECT array_agg(u.n) FROM unnest(v_pnc, v_pnn) AS u(c, n) WHERE u.c = '{{.Name}}');
{{- end}}
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
    -- pass saves an ownership probe per row the claim looks at. The fresh
    -- rows to look at are the caller's rank's key range (exactly its
    -- rank's rows, for any live count), widened to cover the keys of its
    -- streams in v_mine while it has any: a live count that moved by one
    -- shifts each range by less than its width, so those keys are mostly
    -- next to the range.
    IF v_live > 1 THEN
        SELECT COALESCE(array_agg(a.stream_id) FILTER (WHERE a.assigned_instance_id = p_instance_id), '{}'),
               COALESCE(bool_or(a.assigned_instance_id <> p_instance_id), false),
               -- (a stream of unknown partition widens the range to every key)
               min(COALESCE({{.S}}.wp_rank_key(a.partition_number), 0)) FILTER (WHERE a.assigned_instance_id = p_instance_id),
               max(COALESCE({{.S}}.wp_rank_key(a.partition_number), 32767)) FILTER (WHERE a.assigned_instance_id = p_instance_id)
          INTO v_mine, v_strays, v_mlo, v_mhi
          FROM {{.S}}.wp_active_streams a
         -- (an owner that is not live counts too: a needless probe at worst)
         WHERE a.lease_expiry >= v_now
           AND (v_live_ids[{{.S}}.wp_rank_of(a.partition_number, v_live) + 1] = a.assigned_instance_id) IS NOT TRUE;
        -- (wp_rank_of(p, v_live) = v_rank exactly when the key of p is in
        -- [ceil(v_rank * 32768 / v_live), ceil((v_rank + 1) * 32768 / v_live)))
        v_klo := (v_rank * 32768 + v_live - 1) / v_live;
        v_khi := ((v_rank + 1) * 32768 + v_live - 1) / v_live;
        IF v_mlo IS NOT NULL THEN
            v_klo := LEAST(v_klo, v_mlo);
            v_khi := GREATEST(v_khi, v_mhi + 1);
        END IF;
    ELSE
        v_mine := '{}';
    END IF;

    -- 3. Candidates, per category, on the function's first snapshot.
    --    With p_read, only rows up to the seq of the p_read-th fresh row
    --    of the caller's range are candidates, from both sources: the
    --    claim is then the unbounded claim of a table cut after that seq,
    --    so every earlier row of a candidate's scope is read with it, and
    --    the order rules hold as they do unbounded.
{{range .Cats}}
    v_upto := 9223372036854775807;
    IF v_{{.Name}} AND p_read IS NOT NULL THEN
        v_upto := COALESCE(
            (SELECT t.seq FROM {{$.S}}.{{.Table}} t
              WHERE t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL
                AND {{$.S}}.wp_rank_key(t.partition_number) >= v_klo
                AND {{$.S}}.wp_rank_key(t.partition_number) < v_khi
              ORDER BY t.seq OFFSET p_read - 1 LIMIT 1),
            9223372036854775807);
    END IF;
    IF v_{{.Name}} AND n_{{.Name}} IS NULL THEN
        -- Candidates: the first p_max claimable rows by seq that route to the
        -- caller and are not blocked in their scope. Sources are merged by
        -- seq: fresh rows (index order), and waiting rows whose schedule is
        -- due or whose lease expired (few; sorted).
        -- The candidate arrays are parallel (one aggregation fills them
        -- all) and need no order: every later step locks, re-checks and
        -- updates by set, and the gap check compares seqs (so the
        -- aggregates do not each sort the rows again).
        SELECT array_agg(w.k), array_agg(w.tid), array_agg(w.seq),
               array_agg(w.stream_id), array_agg(w.sname), bool_and(w.fresh),
               array_agg(w.partition_number)
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
                    AND t.seq <= v_upto
                  ORDER BY t.seq)
                UNION ALL
                (SELECT t.{{.Key}}, t.ctid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}}, t.partition_number, false
                   FROM {{$.S}}.{{.Table}} t
                  WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                    AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now
                    AND (t.instance_id IS NULL OR t.lease_expiry < v_now)
                    AND (t.scheduled_for IS NULL OR t.scheduled_for <= v_now)
                    AND t.seq <= v_upto
                  ORDER BY t.seq)
              ) u
             WHERE CASE WHEN u.stream_id = '' THEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
                   ELSE CASE WHEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
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
    ELSIF v_{{.Name}} THEN
{{- if .ByName}}
        -- Some of the category's names are paused: their rows are left out.
        -- (Unsorted arrays, as on the path above.)
        SELECT array_agg(w.k), array_agg(w.tid), array_agg(w.seq),
               array_agg(w.stream_id), array_agg(w.sname), bool_and(w.fresh),
               array_agg(w.partition_number)
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
                    AND t.seq <= v_upto
                  ORDER BY t.seq)
                UNION ALL
                (SELECT t.{{.Key}}, t.ctid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}}, t.partition_number, false
                   FROM {{$.S}}.{{.Table}} t
                  WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                    AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now
                    AND (t.instance_id IS NULL OR t.lease_expiry < v_now)
                    AND (t.scheduled_for IS NULL OR t.scheduled_for <= v_now)
                    AND t.seq <= v_upto
                  ORDER BY t.seq)
              ) u
             WHERE CASE WHEN u.stream_id = '' THEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
                   ELSE CASE WHEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
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
               -- (the paused names' scopes hold only their own rows)
               AND u.sname <> ALL (n_{{.Name}})
             ORDER BY u.seq
             LIMIT p_max) w;
{{- else}}
        -- Some of the category's names are paused. A paused row is not
        -- taken and blocks the rest of its stream. The claimable rows are
        -- read in seq order by one query, so on one snapshot (a paused row
        -- routes as its stream's later rows do and is blocked by what
        -- blocks them, so on that snapshot it comes before them whenever
        -- they come), in batches: each batch drops its paused rows and
        -- every later row of their streams, and the rows of streams cut
        -- by an earlier batch, until p_max rows are kept or the rows run
        -- out. The cut streams are compared as a hashed set (wp_cut_batch).
        -- The first batch is p_max rows, so a claim whose rows are all kept
        -- reads what the unpaused claim reads. Each later batch is at least
        -- twice the one before and at least as large as the set of cut
        -- streams it is compared with: every batch's work on that set is
        -- paid for by its own rows, so that work stays linear in the rows
        -- read however many streams it cuts. (Each row's order probe still
        -- reads the earlier waiting rows of its scope, as on every path.)
        v_left := p_max;
        v_batch := p_max;
        v_cutoff := '{}';
        x_n := 0;
        FOR v_r IN
                SELECT u.k, u.tid, u.seq, u.stream_id, u.sname, u.fresh, u.partition_number, u.nm
                  FROM (
                    (SELECT t.{{.Key}} AS k, t.ctid AS tid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}} AS sname, t.partition_number,
                            true AS fresh, t.name AS nm
                       FROM {{$.S}}.{{.Table}} t
                      WHERE t.{{.Done}} IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL
                        AND {{$.S}}.wp_rank_key(t.partition_number) >= v_klo
                        AND {{$.S}}.wp_rank_key(t.partition_number) < v_khi
                        AND t.seq <= v_upto
                      ORDER BY t.seq)
                    UNION ALL
                    (SELECT t.{{.Key}}, t.ctid, t.seq, t.stream_id, {{if .ByName}}t.name{{else}}''::text{{end}}, t.partition_number, false, t.name
                       FROM {{$.S}}.{{.Table}} t
                      WHERE t.{{.Done}} IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                        AND (CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END) <= v_now
                        AND (t.instance_id IS NULL OR t.lease_expiry < v_now)
                        AND (t.scheduled_for IS NULL OR t.scheduled_for <= v_now)
                        AND t.seq <= v_upto
                      ORDER BY t.seq)
                  ) u
                 WHERE CASE WHEN u.stream_id = '' THEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
                       ELSE CASE WHEN {{$.S}}.wp_rank_of(u.partition_number, v_live) = v_rank
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
                   AND NOT (u.stream_id = '' AND u.nm = ANY (n_{{.Name}}))
                 ORDER BY u.seq
        LOOP
            x_id[x_n + 1] := v_r.k;
            x_tid[x_n + 1] := v_r.tid;
            x_seq[x_n + 1] := v_r.seq;
            x_stream[x_n + 1] := v_r.stream_id;
            x_name[x_n + 1] := v_r.sname;
            x_fresh[x_n + 1] := v_r.fresh;
            x_part[x_n + 1] := v_r.partition_number;
            x_nm[x_n + 1] := v_r.nm;
            x_n := x_n + 1;
            CONTINUE WHEN x_n < v_batch;
            SELECT b.* INTO v_b FROM {{$.S}}.wp_cut_batch(x_id, x_tid, x_seq, x_stream, x_name, x_fresh, x_part, x_nm,
                                                        n_{{.Name}}, v_cutoff, v_left) b;
            c_{{.Name}}_id := c_{{.Name}}_id || v_b.ids;
            c_{{.Name}}_tid := c_{{.Name}}_tid || v_b.tids;
            c_{{.Name}}_seq := c_{{.Name}}_seq || v_b.seqs;
            c_{{.Name}}_stream := c_{{.Name}}_stream || v_b.streams;
            c_{{.Name}}_name := c_{{.Name}}_name || v_b.snames;
            c_{{.Name}}_part := c_{{.Name}}_part || v_b.parts;
            IF v_b.ids IS NOT NULL THEN
                c_{{.Name}}_fresh := COALESCE(c_{{.Name}}_fresh, true) AND v_b.fresh;
            END IF;
            v_cutoff := v_cutoff || v_b.cut;
            v_left := p_max - COALESCE(cardinality(c_{{.Name}}_id), 0);
            v_batch := greatest(v_left, least(2 * v_batch, 1073741824), cardinality(v_cutoff));
            x_n := 0;
            x_id := NULL; x_tid := NULL; x_seq := NULL; x_stream := NULL;
            x_name := NULL; x_fresh := NULL; x_part := NULL; x_nm := NULL;
            EXIT WHEN v_left = 0;
            -- Test sessions can be held here, between two batches, while
            -- a peer changes rows the next batch reads.
            IF current_setting('workpump.pause_points', true) = 'on' THEN
                PERFORM {{$.S}}.wp_pause_point('claim.between_batches', p_instance_id);
            END IF;
        END LOOP;
        IF x_n > 0 THEN
            SELECT b.* INTO v_b FROM {{$.S}}.wp_cut_batch(x_id, x_tid, x_seq, x_stream, x_name, x_fresh, x_part, x_nm,
                                                        n_{{.Name}}, v_cutoff, v_left) b;
            c_{{.Name}}_id := c_{{.Name}}_id || v_b.ids;
            c_{{.Name}}_tid := c_{{.Name}}_tid || v_b.tids;
            c_{{.Name}}_seq := c_{{.Name}}_seq || v_b.seqs;
            c_{{.Name}}_stream := c_{{.Name}}_stream || v_b.streams;
            c_{{.Name}}_name := c_{{.Name}}_name || v_b.snames;
            c_{{.Name}}_part := c_{{.Name}}_part || v_b.parts;
            IF v_b.ids IS NOT NULL THEN
                c_{{.Name}}_fresh := COALESCE(c_{{.Name}}_fresh, true) AND v_b.fresh;
            END IF;
            x_n := 0;
            x_id := NULL; x_tid := NULL; x_seq := NULL; x_stream := NULL;
            x_name := NULL; x_fresh := NULL; x_part := NULL; x_nm := NULL;
        END IF;
{{- end}}
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
            -- out; it carries no order. (Such a row can also be held by that
            -- instance's completion, which may wait for a stream this claim
            -- holds: Postgres then rolls one of the two back, and the
            -- drivers run a call it rolled back again.) The key test (a
            -- hashed set: IS TRUE keeps it from becoming a join) guards
            -- against a reused ctid.
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
