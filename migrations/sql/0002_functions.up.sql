-- workpump schema, version 2: the SQL functions every Postgres driver calls.
--
-- Conventions:
--  * Write functions run with enable_seqscan = off: their statements address
--    rows by key, ctid or partial index, and the planner must not trade that
--    for a scan of the table because a statistic is stale or an array-derived
--    row count is a guess. They also run with plan_cache_mode =
--    force_generic_plan: their statements' plans are built not to depend on
--    the values of their variables, and under the default (auto) mode
--    PL/pgSQL planned some of them anew on every call, because plans made
--    for the values looked cheaper (one-item enqueue, claim and completion:
--    0.2-0.3, 0.22-0.24 and 0.08-0.1 ms per call, measured against the
--    setting for the whole session).
--  * Every function takes p_now timestamptz DEFAULT NULL and works at
--    COALESCE(p_now, now()): the database clock unless a test harness injects one.
--    Parameters added later follow p_now, with defaults, so older call
--    texts keep working.
--  * Durations are bigint nanoseconds (Go time.Duration); stored times are
--    truncated to microseconds, as Go's Truncate(time.Microsecond) would.
--  * Errors: SQLSTATE WP001 unknown instance, WP002 unknown category, WP003
--    category not renewable, 22023 invalid argument.
--  * Lock order, to stay deadlock-free: work tables in the fixed order
--    outbox, inbox, perspective_event, receptor, rows within a table by key,
--    then stream rows sorted by stream_id. ClaimWork locks streams first but
--    never waits on a work row or a stream row (SKIP LOCKED), so it cannot
--    be part of a cycle.
--  * Partial indexes are only used where meant: a lookup by key or stream
--    writes a test like (instance_id = x) IS TRUE, which the planner cannot
--    use to prove a partial index predicate, so a stale statistic can never
--    turn a key lookup into a walk over every leased row.

-- wp_channel is the LISTEN/NOTIFY channel of one instance in this schema.
-- The schema tag keeps two schemas in one database from waking each other.
CREATE FUNCTION {{.S}}.wp_channel(p_instance_id uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT {{.ChanLit}} || replace(p_instance_id::text, '-', '') $fn$;

-- wp_alive_lock_key is the session advisory lock key (bigint form) of one
-- instance's alive-lock: hashtextextended('workpump:<schema>:alive:<uuid>', 0).
-- In pg_locks it appears as locktype 'advisory', classid = high 32 bits,
-- objid = low 32 bits, objsubid = 1.
CREATE FUNCTION {{.S}}.wp_alive_lock_key(p_instance_id uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT hashtextextended('workpump:' || {{.Lit}} || ':alive:' || p_instance_id::text, 0) $fn$;

-- wp_wake_lock_key is the advisory lock key of one instance's self-polling
-- hand-shake (driver.SelfPolling). 'polling' is held exclusively by the
-- instance (session lock) while it polls by itself; 'handshake' is held
-- shared by every enqueue that skipped its NOTIFY for that reason, until
-- the enqueue's transaction ends, and exclusively by the instance for its
-- last claim of the period.
CREATE FUNCTION {{.S}}.wp_wake_lock_key(p_instance_id uuid, p_lock text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT hashtextextended('workpump:' || {{.Lit}} || ':' || p_lock || ':' || p_instance_id::text, 0) $fn$;

-- wp_polls_by_itself reports whether p_instance_id holds its polling lock,
-- without keeping any hold (a shared try-lock, released at once).
CREATE FUNCTION {{.S}}.wp_polls_by_itself(p_instance_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    v_key bigint := {{.S}}.wp_wake_lock_key(p_instance_id, 'polling');
BEGIN
    IF pg_try_advisory_lock_shared(v_key) THEN
        PERFORM pg_advisory_unlock_shared(v_key);
        RETURN false;
    END IF;
    RETURN true;
END
$fn$;

-- wp_wakeup_needed decides, inside an enqueue's transaction, whether it must
-- NOTIFY p_instance_id: not while the instance polls by itself. Before it
-- skips, the transaction takes the hand-shake lock shared (held until it
-- ends) and checks again, so the instance cannot finish ending its period
-- (which takes the hand-shake exclusively, then claims once more) before
-- this transaction's rows are committed or gone. While the instance runs
-- that last claim, enqueues notify.
CREATE FUNCTION {{.S}}.wp_wakeup_needed(p_instance_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF NOT {{.S}}.wp_polls_by_itself(p_instance_id) THEN
        RETURN true;
    END IF;
    IF NOT pg_try_advisory_xact_lock_shared({{.S}}.wp_wake_lock_key(p_instance_id, 'handshake')) THEN
        RETURN true;
    END IF;
    RETURN NOT {{.S}}.wp_polls_by_itself(p_instance_id);
END
$fn$;

-- wp_held_alive_locks lists the instances of p_ids whose alive-lock some
-- session holds right now.
CREATE FUNCTION {{.S}}.wp_held_alive_locks(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql VOLATILE
AS $fn$
    SELECT k.id
      FROM (SELECT u.id, {{.S}}.wp_alive_lock_key(u.id) AS key FROM unnest(p_ids) AS u(id)) k
     WHERE EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
           AND l.classid = ((k.key >> 32) & 4294967295)::oid
           AND l.objid = (k.key & 4294967295)::oid)
$fn$;

-- wp_ns converts nanoseconds to an interval truncated to microseconds. The
-- interval is built from hours and seconds only (never days or months), so
-- adding it to a timestamptz means elapsed time whatever the session time
-- zone, and it is exact over the whole range of a Go time.Duration.
CREATE FUNCTION {{.S}}.wp_ns(p_ns bigint) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT make_interval(hours => (p_ns / 3600000000000)::integer, secs => ((p_ns / 1000) % 3600000000) / 1000000.0)
$fn$;

-- wp_retry_delay mirrors driver.RetryDelay: min(base << min(attempts, 10), max),
-- computed in nanoseconds without overflow and returned at microsecond precision.
CREATE FUNCTION {{.S}}.wp_retry_delay(p_attempts integer, p_base_ns bigint, p_max_ns bigint) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT {{.S}}.wp_ns(CASE WHEN p_base_ns <= 0 OR p_base_ns > (p_max_ns >> least(greatest(p_attempts, 0), 10))
                             THEN p_max_ns ELSE p_base_ns << least(greatest(p_attempts, 0), 10) END)
$fn$;

-- wp_release_instances clears every lease and stream ownership held by
-- p_ids (attempts unchanged) and returns how many work rows it released.
CREATE FUNCTION {{.S}}.wp_release_instances(p_ids uuid[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_n integer := 0;
    v_c integer;
BEGIN
{{- range .Cats}}
    WITH lk AS (
        SELECT t.ctid AS tid
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.instance_id = ANY (p_ids)
         ORDER BY t.{{.Key}}
           FOR UPDATE)
    UPDATE {{$.S}}.{{.Table}} t
       SET instance_id = NULL, lease_expiry = NULL
     WHERE t.ctid = ANY (ARRAY(SELECT lk.tid FROM lk))
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

{{/* Blocks shared by wp_enqueue and wp_enqueue_prepare (rendered into
both, so neither pays a nested call). */}}
{{- define "enqueueLockStreams"}}
    -- Serialize with other enqueues and claims of the same streams until
    -- the caller commits (sorted, so one call cannot deadlock itself).
    -- Existing lock rows are locked first (the common case: one
    -- statement); missing ones are created, then locked too (a row another
    -- enqueue created meanwhile conflicts, and is locked after its commit).
    -- v_streams may repeat a stream (= ANY matches each lock row once), so
    -- only the missing streams, usually none, are sorted and deduplicated:
    -- a DISTINCT over every item's stream was ~2 ms of a 5000-item call.
    v_streams := array_remove(p_streams, '');
    IF cardinality(v_streams) > 0 THEN
        v_locked := ARRAY(SELECT l.stream_id FROM {{.S}}.wp_stream_locks l
                           WHERE l.stream_id = ANY (v_streams)
                           ORDER BY l.stream_id
                             FOR NO KEY UPDATE);
        IF cardinality(v_locked) < cardinality(v_streams) THEN
            v_missing := ARRAY(SELECT DISTINCT s COLLATE "C" FROM unnest(v_streams) s
                                WHERE s NOT IN (SELECT unnest(v_locked)) ORDER BY 1);
            IF cardinality(v_missing) > 0 THEN
                INSERT INTO {{.S}}.wp_stream_locks (stream_id)
                SELECT s FROM unnest(v_missing) s ORDER BY s COLLATE "C"
                ON CONFLICT (stream_id) DO NOTHING;
                PERFORM 1 FROM {{.S}}.wp_stream_locks l
                  WHERE l.stream_id = ANY (v_missing)
                  ORDER BY l.stream_id
                    FOR NO KEY UPDATE;
            END IF;
        END IF;
    END IF;
{{- end}}
{{- define "enqueueLive"}}
        SELECT array_agg(i.instance_id ORDER BY i.instance_id) INTO v_live FROM {{.S}}.wp_service_instances i;
{{- end}}
{{- define "enqueueNotify"}}
        -- NOTIFY the instance that will claim each due item (w_cat, w_stream,
        -- w_part): the live stream owner, else the rank owner.
        IF v_live IS NOT NULL THEN
            PERFORM pg_notify({{.S}}.wp_channel(x.target), x.cat)
               FROM (SELECT DISTINCT u.cat,
                            COALESCE(CASE WHEN u.stream_id <> '' THEN
                                         (SELECT own.assigned_instance_id
                                            FROM {{.S}}.wp_active_streams own
                                           WHERE own.stream_id = u.stream_id AND own.lease_expiry >= v_now
                                             AND (own.assigned_instance_id = ANY (v_live)) IS TRUE) END,
                                     v_live[(u.part % cardinality(v_live)) + 1]) AS target
                       FROM unnest(w_cat, w_stream, w_part) AS u(cat, stream_id, part)) x
              WHERE {{.S}}.wp_wakeup_needed(x.target);
        END IF;
{{- end}}

-- wp_enqueue stores new work (parallel arrays, one element per item) and
-- returns the number of rows inserted. An id already present in its table is
-- skipped (ON CONFLICT DO NOTHING): inbox rows stay after processing, so a
-- redelivered inbox message is deduplicated; p_new_ids = true says every id
-- was generated for this call (so none can be present) and skips that check
-- (a plain insert; a generated id that did collide fails the call with a
-- unique violation instead of being dropped). Partitions are computed by the
-- caller (driver.PartitionOf). The stream lock rows of the items stay locked
-- until the caller's transaction ends, so enqueues of one stream commit in
-- seq order and no claim takes the stream meanwhile. Each due item NOTIFYs
-- the instance that will claim it (the live stream owner, else the rank
-- owner), unless that instance polls by itself (wp_wakeup_needed); NOTIFY
-- is sent at commit.
CREATE FUNCTION {{.S}}.wp_enqueue(
    p_categories    text[],
    p_ids           uuid[],
    p_streams       text[],
    p_partitions    integer[],
    p_names         text[],
    p_types         text[],
    p_payloads      bytea[],
    p_metadata      text[],
    p_scheduled_for timestamptz[],
    p_now           timestamptz DEFAULT NULL,
    p_new_ids       boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := COALESCE(p_now, now());
    v_n       integer := cardinality(p_ids);
    v_total   integer := 0;
    v_c       integer;
    v_streams text[];
    v_locked  text[];
    v_missing text[];
    v_live    uuid[];
    w_cat     text[] := '{}';
    w_stream  text[] := '{}';
    w_part    integer[] := '{}';
    x_cat     text[];
    x_stream  text[];
    x_part    integer[];
BEGIN
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN 0;
    END IF;
    IF cardinality(p_categories) IS DISTINCT FROM v_n OR cardinality(p_streams) IS DISTINCT FROM v_n
       OR cardinality(p_partitions) IS DISTINCT FROM v_n OR cardinality(p_names) IS DISTINCT FROM v_n
       OR cardinality(p_types) IS DISTINCT FROM v_n OR cardinality(p_payloads) IS DISTINCT FROM v_n
       OR cardinality(p_metadata) IS DISTINCT FROM v_n OR cardinality(p_scheduled_for) IS DISTINCT FROM v_n THEN
        RAISE EXCEPTION 'workpump: wp_enqueue: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF v_n = 1 THEN
        -- One item (an application's transaction enqueueing its message):
        -- the same steps on scalars, which costs half the set-based path.
        IF p_categories[1] IS NULL OR p_categories[1] NOT IN ({{.CatList}}) THEN
            RAISE EXCEPTION 'workpump: wp_enqueue: unknown category in p_categories' USING ERRCODE = 'WP002';
        END IF;
        IF p_streams[1] <> '' THEN
            PERFORM 1 FROM {{.S}}.wp_stream_locks l WHERE l.stream_id = p_streams[1] FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                INSERT INTO {{.S}}.wp_stream_locks (stream_id) VALUES (p_streams[1]) ON CONFLICT (stream_id) DO NOTHING;
                PERFORM 1 FROM {{.S}}.wp_stream_locks l WHERE l.stream_id = p_streams[1] FOR NO KEY UPDATE;
            END IF;
        END IF;
{{- range $i, $c := .Cats}}
        {{if $i}}ELS{{end}}IF p_categories[1] = '{{$c.Name}}' THEN
{{- range $dedupe := $.Dedupe}}
            IF {{if $dedupe}}NOT {{end}}COALESCE(p_new_ids, false) THEN
                INSERT INTO {{$.S}}.{{$c.Table}} AS t
                    ({{$c.Key}}, stream_id, partition_number, name, message_type, payload, metadata, scheduled_for, created_at)
                VALUES (p_ids[1], p_streams[1], p_partitions[1], p_names[1], p_types[1], p_payloads[1],
                        COALESCE(NULLIF(p_metadata[1], ''), '{}')::json, date_trunc('microseconds', p_scheduled_for[1]), v_now)
{{- if $dedupe}}
                ON CONFLICT ({{$c.Key}}) DO NOTHING
{{- end}};
                GET DIAGNOSTICS v_total = ROW_COUNT;
            END IF;
{{- end}}
{{- end}}
        END IF;
        IF v_total > 0 AND (p_scheduled_for[1] IS NULL OR date_trunc('microseconds', p_scheduled_for[1]) <= v_now) THEN
            w_cat := p_categories;
            w_stream := p_streams;
            w_part := p_partitions;
{{- template "enqueueLive" .}}
{{- template "enqueueNotify" .}}
        END IF;
        RETURN v_total;
    END IF;
    -- (<@ is false for an array holding a NULL; the per-element test it
    -- replaced cost ~1 ms per 5000 items)
    IF NOT (p_categories <@ ARRAY[{{.CatList}}]) THEN
        RAISE EXCEPTION 'workpump: wp_enqueue: unknown category in p_categories' USING ERRCODE = 'WP002';
    END IF;
{{template "enqueueLockStreams" .}}
{{range $c := .Cats}}
    IF '{{$c.Name}}' = ANY (p_categories) THEN
{{- range $dedupe := $.Dedupe}}
        -- {{if $dedupe}}Ids may repeat stored ones (the caller chose them): skip those.{{else}}Every id is new (generated for this call): a plain insert, a third cheaper.{{end}}
        IF {{if $dedupe}}NOT {{end}}COALESCE(p_new_ids, false) THEN
            WITH ins AS (
                INSERT INTO {{$.S}}.{{$c.Table}} AS t
                    ({{$c.Key}}, stream_id, partition_number, name, message_type, payload, metadata, scheduled_for, created_at)
                SELECT u.id, u.stream_id, u.part, u.name, u.mtype, u.payload, COALESCE(NULLIF(u.meta, ''), '{}')::json,
                       date_trunc('microseconds', u.sched), v_now
                  FROM unnest(p_categories, p_ids, p_streams, p_partitions, p_names, p_types, p_payloads, p_metadata, p_scheduled_for)
                       WITH ORDINALITY AS u(cat, id, stream_id, part, name, mtype, payload, meta, sched, ord)
                 WHERE u.cat = '{{$c.Name}}'
                 ORDER BY u.ord
{{- if $dedupe}}
                ON CONFLICT ({{$c.Key}}) DO NOTHING
{{- end}}
                RETURNING t.stream_id, t.partition_number, t.scheduled_for)
            SELECT count(*)::integer,
                   array_agg(ins.stream_id) FILTER (WHERE ins.scheduled_for IS NULL OR ins.scheduled_for <= v_now),
                   array_agg(ins.partition_number) FILTER (WHERE ins.scheduled_for IS NULL OR ins.scheduled_for <= v_now)
              INTO v_c, x_stream, x_part
              FROM ins;
        END IF;
{{- end}}
        v_total := v_total + v_c;
        IF x_stream IS NOT NULL THEN
            w_cat := w_cat || array_fill('{{$c.Name}}'::text, ARRAY[cardinality(x_stream)]);
            w_stream := w_stream || x_stream;
            w_part := w_part || x_part;
        END IF;
    END IF;
{{end}}
    IF cardinality(w_cat) > 0 THEN
{{- template "enqueueLive" .}}
{{- template "enqueueNotify" .}}
    END IF;
    RETURN v_total;
END
$fn$;

-- wp_enqueue_prepare is wp_enqueue without the insert, for a caller that
-- then writes the rows itself with COPY, in the same transaction (parallel
-- arrays as wp_enqueue's; every id generated for the call). It checks the
-- categories, locks the items' streams until the caller's transaction
-- ends, NOTIFYs the instances that will claim the due items, and returns
-- the created_at to store (the database clock, or p_now). The COPY leaves
-- seq to its default: nextval per row, in row order, after these locks, so
-- a stream's rows still commit in seq order; and since nextval is the one
-- volatile default COPY allows in its multi-row inserts, Postgres writes the
-- rows a page at a time instead of one by one.
CREATE FUNCTION {{.S}}.wp_enqueue_prepare(
    p_categories    text[],
    p_streams       text[],
    p_partitions    integer[],
    p_scheduled_for timestamptz[],
    p_now           timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := COALESCE(p_now, now());
    v_n       integer := cardinality(p_categories);
    v_streams text[];
    v_locked  text[];
    v_missing text[];
    v_live    uuid[];
    w_cat     text[];
    w_stream  text[];
    w_part    integer[];
BEGIN
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN v_now;
    END IF;
    IF cardinality(p_streams) IS DISTINCT FROM v_n OR cardinality(p_partitions) IS DISTINCT FROM v_n
       OR cardinality(p_scheduled_for) IS DISTINCT FROM v_n THEN
        RAISE EXCEPTION 'workpump: wp_enqueue_prepare: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    -- (<@ is false for an array holding a NULL; the per-element test it
    -- replaced cost ~1 ms per 5000 items)
    IF NOT (p_categories <@ ARRAY[{{.CatList}}]) THEN
        RAISE EXCEPTION 'workpump: wp_enqueue_prepare: unknown category in p_categories' USING ERRCODE = 'WP002';
    END IF;
{{template "enqueueLockStreams" .}}
{{- template "enqueueLive" .}}
    IF v_live IS NOT NULL THEN
        SELECT array_agg(u.cat), array_agg(u.stream_id), array_agg(u.part)
          INTO w_cat, w_stream, w_part
          FROM unnest(p_categories, p_streams, p_partitions, p_scheduled_for) AS u(cat, stream_id, part, sched)
         WHERE u.sched IS NULL OR date_trunc('microseconds', u.sched) <= v_now;
{{- template "enqueueNotify" .}}
    END IF;
    RETURN v_now;
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
-- every candidate in seq), then the rows are re-checked and locked under a
-- new snapshot, and a candidate that can no longer be taken drops every later
-- candidate of its scope.
-- Plans avoid joins between array-derived sets (their row estimates are
-- guesses): per-row lookups are correlated index probes, and the common
-- paths (every stream locked, every row locked) skip the gap bookkeeping.
CREATE FUNCTION {{.S}}.wp_claim_work(
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
    v_locked   text[];
    v_exist    text[]; -- locked streams that have an ownership row
    v_all      boolean;
    v_every    boolean; -- every candidate's stream is locked and owned
    v_tids     tid[];
    v_got      uuid[];
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
    IF {{range $i, $c := .Cats}}{{if $i}} AND {{end}}c_{{.Name}}_id IS NULL{{end}} THEN
        RETURN;
    END IF;

    -- From here on the claim writes. Key-share lock our instance row so a
    -- concurrent cleanup (which skips locked rows) cannot evict us mid-claim.
    PERFORM 1 FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workpump: instance % is not registered', p_instance_id USING ERRCODE = 'WP001';
    END IF;

    -- The candidates' distinct streams with their partitions, in no order
    -- (each statement that locks or writes by stream sorts for itself; two
    -- aggregates of one input stay parallel). A hashed grouping: the sorted
    -- form (DISTINCT ON and ordered aggregates) took ~0.35 ms more per 1000.
    SELECT COALESCE(array_agg(g.s), '{}'), COALESCE(array_agg(g.part), '{}')
      INTO v_streams, v_sparts
      FROM (SELECT u.s, min(u.part) AS part
              FROM unnest({{range $i, $c := .Cats}}{{if $i}} || {{end}}COALESCE(c_{{.Name}}_stream, '{}'){{end}},
                          {{range $i, $c := .Cats}}{{if $i}} || {{end}}COALESCE(c_{{.Name}}_part, '{}'){{end}}) AS u(s, part)
             WHERE u.s <> ''
             GROUP BY u.s) g;
    IF cardinality(v_streams) > 0 THEN
        -- Lock the streams (an open enqueue or a concurrent claim of a
        -- stream makes us skip it), then take ownership of those not owned
        -- by another live instance with an unexpired stream lease.
        -- Existing lock rows first; then the missing ones are created (a
        -- row this claim inserts is its own until commit). A row locked by
        -- someone else conflicts and is skipped, like a SKIP LOCKED row.
        v_locked := ARRAY(
            SELECT l.stream_id FROM {{.S}}.wp_stream_locks l
             WHERE l.stream_id = ANY (v_streams)
             ORDER BY l.stream_id
               FOR UPDATE SKIP LOCKED);
        IF cardinality(v_locked) < cardinality(v_streams) THEN
            WITH ins AS (
                INSERT INTO {{.S}}.wp_stream_locks (stream_id)
                SELECT s FROM unnest(v_streams) s
                 WHERE s NOT IN (SELECT unnest(v_locked))
                 ORDER BY s COLLATE "C"
                ON CONFLICT (stream_id) DO NOTHING
                RETURNING stream_id)
            SELECT v_locked || COALESCE(array_agg(ins.stream_id), '{}') INTO v_locked FROM ins;
        END IF;
        -- Ownership: existing rows are updated, missing ones inserted
        -- plainly (an upsert's speculative insertion costs a third more).
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
                   SET assigned_instance_id = p_instance_id, lease_expiry = v_exp
                 WHERE a.stream_id = ANY (v_exist)
                   AND (a.assigned_instance_id IS NULL OR a.assigned_instance_id = p_instance_id
                        OR a.lease_expiry < v_now OR NOT (a.assigned_instance_id = ANY (v_live_ids)))
                RETURNING a.stream_id)
            SELECT COALESCE(array_agg(up.stream_id), '{}') INTO v_owned FROM up;
        END IF;
        WITH ins AS (
            INSERT INTO {{.S}}.wp_active_streams (stream_id, assigned_instance_id, lease_expiry, partition_number)
            SELECT x.s, p_instance_id, v_exp, x.part FROM unnest(v_streams, v_sparts) AS x(s, part)
             WHERE x.s IN (SELECT unnest(v_locked)) AND x.s NOT IN (SELECT unnest(v_exist))
             ORDER BY x.s COLLATE "C"
            RETURNING stream_id)
        SELECT v_owned || COALESCE(array_agg(ins.stream_id), '{}') INTO v_owned FROM ins;
        IF cardinality(v_owned) < cardinality(v_locked) THEN
            WITH up AS (
                INSERT INTO {{.S}}.wp_active_streams AS a (stream_id, assigned_instance_id, lease_expiry, partition_number)
                SELECT x.s, p_instance_id, v_exp, x.part FROM unnest(v_streams, v_sparts) AS x(s, part)
                 WHERE x.s IN (SELECT unnest(v_locked)) AND x.s NOT IN (SELECT unnest(v_owned))
                 ORDER BY x.s COLLATE "C"
                ON CONFLICT (stream_id) DO UPDATE
                   SET assigned_instance_id = EXCLUDED.assigned_instance_id, lease_expiry = EXCLUDED.lease_expiry,
                       partition_number = EXCLUDED.partition_number
                 WHERE a.assigned_instance_id IS NULL OR a.assigned_instance_id = p_instance_id
                    OR a.lease_expiry < v_now OR NOT (a.assigned_instance_id = ANY (v_live_ids))
                RETURNING a.stream_id)
            SELECT v_owned || COALESCE(array_agg(up.stream_id), '{}') INTO v_owned FROM up;
        END IF;
    END IF;
{{range .Cats}}
    IF c_{{.Name}}_id IS NOT NULL THEN
        v_every := cardinality(v_owned) = cardinality(v_streams);
        IF v_every AND c_{{.Name}}_fresh THEN
            -- Fast path: every candidate is a fresh row and every stream is
            -- locked and owned. Nobody else changes a fresh row of a locked
            -- stream (other claimers need the stream lock; acks, renewals
            -- and cleanup touch leased rows only), so no candidate can drop
            -- out and leave a gap: update them directly, without the lock
            -- step. A fresh streamless row another claimer (after a rank
            -- change) took meanwhile fails the re-check and is left out;
            -- it carries no order. The key test (a hashed set: IS TRUE
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
            -- Take all candidates, except those of skipped streams.
            -- Re-check and lock them under a fresh snapshot, by ctid (a row
            -- updated meanwhile is followed to its latest version and
            -- re-checked; the key test, pairwise through the join, guards
            -- against a ctid reused by another row; an "= ANY (ids)" test
            -- would compare every row with every id).
            WITH lk AS (
                SELECT t.ctid AS tid, t.{{.Key}} AS k
                  FROM unnest(c_{{.Name}}_tid, c_{{.Name}}_id, c_{{.Name}}_stream) AS c(tid, k, stream_id)
                  JOIN {{$.S}}.{{.Table}} t ON t.ctid = c.tid
                 WHERE t.{{.Key}} = c.k
                   AND (v_every OR c.stream_id = '' OR c.stream_id IN (SELECT unnest(v_owned)))
                   AND t.{{.Done}} IS NULL
                   AND (t.instance_id IS NULL OR t.lease_expiry < v_now)
                   AND (t.scheduled_for IS NULL OR t.scheduled_for <= v_now)
                   FOR UPDATE OF t SKIP LOCKED)
            SELECT array_agg(lk.tid), array_agg(lk.k) INTO v_tids, v_got FROM lk;
            IF cardinality(v_got) IS DISTINCT FROM cardinality(c_{{.Name}}_id) AND v_got IS NOT NULL THEN
                -- Some candidate cannot be taken (or its stream was
                -- skipped): keep a locked row only if no earlier candidate
                -- of its scope is missing.
                v_tids := ARRAY(
                    SELECT g.tid
                      FROM (SELECT c.k, c.seq, c.stream_id, c.sname, l.tid,
                                   min(c.seq) FILTER (WHERE l.tid IS NULL) OVER (PARTITION BY c.stream_id, c.sname) AS gap
                              FROM unnest(c_{{.Name}}_id, c_{{.Name}}_seq, c_{{.Name}}_stream, c_{{.Name}}_name) AS c(k, seq, stream_id, sname)
                              LEFT JOIN unnest(v_got, v_tids) AS l(k, tid) ON l.k = c.k) g
                     WHERE g.tid IS NOT NULL AND (g.stream_id = '' OR g.gap IS NULL OR g.seq < g.gap));
            END IF;
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

-- wp_renew_leases sets lease_expiry = now+lease on the rows of p_ids that are
-- pending and leased to p_instance_id (owner fencing: a lease lost to a peer
-- is not stolen back), extends the stream lease of their streams the caller
-- owns, and returns the renewed ids. Receptor leases are not renewable.
CREATE FUNCTION {{.S}}.wp_renew_leases(
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
        WITH lk AS (
            SELECT t.ctid AS tid
              FROM {{$.S}}.{{.Table}} t
             WHERE t.{{.Key}} = ANY (p_ids) AND t.instance_id = p_instance_id
             ORDER BY t.{{.Key}}
               FOR UPDATE),
        up AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET lease_expiry = v_exp
             WHERE t.ctid = ANY (ARRAY(SELECT lk.tid FROM lk))
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
           SET lease_expiry = v_exp
          FROM (SELECT s.stream_id FROM {{.S}}.wp_active_streams s
                 WHERE s.stream_id = ANY (v_streams) AND (s.assigned_instance_id = p_instance_id) IS TRUE
                 ORDER BY s.stream_id
                   FOR NO KEY UPDATE SKIP LOCKED) l
         WHERE a.stream_id = l.stream_id;
    END IF;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT unnest(v_ids);
    END IF;
END
$fn$;

-- wp_settle_streams ends p_instance_id's ownership of those of p_streams in
-- which it no longer holds a pending leased row in any category, so a stream
-- goes back to its rank owner between batches instead of sticking to
-- whichever instance claimed it first. The ownership row is deleted, not
-- cleared: a delete writes no new tuple and no index entry, and the next
-- claim of the stream inserts a fresh row. Rows are filtered before they are
-- locked (a stream that stays owned costs no lock), locked in stream order
-- (as every other writer of wp_active_streams does, so no deadlock), and
-- deleted by ctid. A category without any blocking row is not probed per
-- stream. (OFFSET 0 keeps each NOT EXISTS a per-stream index probe: as an
-- anti-join a stale row estimate could make it scan every blocker row once
-- per stream.)
--
-- p_parts and p_cats, parallel to p_streams, are the partition and category
-- of each settled row. An ownership that ends on a stream whose partition
-- now ranks to another live instance (ranks moved while it was owned) wakes
-- that instance with a NOTIFY of the row's category: rows of the stream
-- enqueued meanwhile were announced to the owner, which no longer takes
-- them, and the rank owner would otherwise find them only at its next
-- claim (its safety-net poll, seconds away, when idle). No index finds a
-- stream's fresh rows, so the wake goes whether or not one is pending; in
-- the steady state every settled stream ranks to its owner and nothing is
-- sent.
{{- define "settleDelete"}}
    DELETE FROM {{.S}}.wp_active_streams a
     WHERE a.ctid = ANY (ARRAY(
        SELECT s.ctid FROM {{.S}}.wp_active_streams s
         WHERE s.stream_id = ANY (p_streams) AND (s.assigned_instance_id = p_instance_id) IS TRUE
{{- range .Cats}}
           AND (NOT v_{{.Name}} OR NOT EXISTS (
                  SELECT 1 FROM {{$.S}}.{{.Table}} t
                   WHERE t.stream_id = s.stream_id AND t.{{.Done}} IS NULL AND t.stream_id <> ''
                     AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)
                     AND (t.instance_id = p_instance_id) IS TRUE
                  OFFSET 0))
{{- end}}
         ORDER BY s.stream_id
           FOR UPDATE))
{{- end}}
CREATE FUNCTION {{.S}}.wp_settle_streams(
    p_instance_id uuid,
    p_streams     text[],
    p_parts       integer[] DEFAULT NULL,
    p_cats        text[] DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
{{- range .Cats}}
    v_{{.Name}} boolean;
{{- end}}
    v_live uuid[];
    v_gone text[];
BEGIN
    SELECT {{range $i, $c := .Cats}}{{if $i}},
           {{end}}EXISTS (SELECT 1 FROM {{$.S}}.{{.Table}} t
                    WHERE t.{{.Done}} IS NULL AND t.stream_id <> ''
                      AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)){{end}}
      INTO {{range $i, $c := .Cats}}{{if $i}}, {{end}}v_{{.Name}}{{end}};
    IF p_parts IS NOT NULL AND cardinality(p_parts) = cardinality(p_streams) THEN
        v_live := ARRAY(SELECT i.instance_id FROM {{.S}}.wp_service_instances i ORDER BY i.instance_id);
    END IF;
    IF cardinality(v_live) > 1 AND EXISTS (
           SELECT 1 FROM unnest(p_parts) AS p(part)
            WHERE v_live[(p.part % cardinality(v_live)) + 1] <> p_instance_id) THEN
        WITH d AS ({{template "settleDelete" .}}
            RETURNING a.stream_id)
        SELECT array_agg(d.stream_id) INTO v_gone FROM d;
        IF v_gone IS NOT NULL THEN
            PERFORM pg_notify({{.S}}.wp_channel(x.target), x.cat)
               FROM (SELECT DISTINCT f.target, f.cat
                       FROM (SELECT v_live[(u.part % cardinality(v_live)) + 1] AS target, u.cat, u.s
                               FROM unnest(p_streams, p_parts, p_cats) AS u(s, part, cat)) f
                      WHERE f.target <> p_instance_id AND f.cat IS NOT NULL
                        -- (a hashed set: "= ANY (v_gone)" would compare each
                        -- row with every settled stream; IS TRUE keeps it
                        -- from becoming a join)
                        AND (f.s IN (SELECT unnest(v_gone))) IS TRUE) x;
        END IF;
    ELSE{{template "settleDelete" .}};
    END IF;
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
-- attempts), fenced: only rows still leased to p_instance_id at that attempt
-- are applied. Rows are deleted, except inbox rows, which are kept with
-- processed_at set so a redelivered message id is deduplicated. Returns the
-- applied (category, id) pairs. Rows are found and written in one pass (a
-- nested loop over the ids sorted by key, so rows are locked in key order);
-- a row changed meanwhile is re-checked against the fence in its latest
-- version. (Locking first and writing by ctid took a second WAL record and
-- tuple change per row: about 12 % of the call.)
CREATE FUNCTION {{.S}}.wp_complete(
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
             WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- else}}
        d AS (
            DELETE FROM {{$.S}}.{{.Table}} t
             USING r
             WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
{{- end}}
        SELECT array_agg(d.k), array_agg(d.stream_id) FILTER (WHERE d.stream_id <> ''),
               array_agg(d.partition_number) FILTER (WHERE d.stream_id <> '')
          INTO x_ids, x_streams, x_parts FROM d;
        IF x_ids IS NOT NULL THEN
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_ids)]);
            v_ids := v_ids || x_ids;
            {{- template "settleCollect" .}}
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
        {{- template "settleCollect" .}}
    END IF;
{{- end}}
    IF cardinality(v_streams) > 0 THEN
        PERFORM {{.S}}.wp_settle_streams(p_instance_id, v_streams, v_parts, v_scats);
    END IF;
    RETURN QUERY SELECT u.c, u.k, u.d FROM unnest(v_cat, v_ids, v_dead) AS u(c, k, d);
END
$fn$;

-- wp_release clears the leases of attempts the caller never ran and gives
-- the attempt back (attempts - 1), fenced like wp_complete. Returns the
-- applied (category, id) pairs.
CREATE FUNCTION {{.S}}.wp_release(
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
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_categories) OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_attempts) THEN
        RAISE EXCEPTION 'workpump: wp_release: argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
{{- range .Cats}}
    IF '{{.Name}}' = ANY (p_categories) THEN
        WITH lk AS (
            SELECT x.tid
              FROM (SELECT u.k, u.att FROM unnest(p_categories, p_ids, p_attempts) AS u(cat, k, att)
                     WHERE u.cat = '{{.Name}}' ORDER BY u.k) r
             CROSS JOIN LATERAL (
                SELECT t.ctid AS tid FROM {{$.S}}.{{.Table}} t
                 WHERE t.{{.Key}} = r.k AND t.attempts = r.att AND t.instance_id = p_instance_id
                   FOR UPDATE OF t) x),
        up AS (
            UPDATE {{$.S}}.{{.Table}} t
               SET instance_id = NULL, lease_expiry = NULL, attempts = t.attempts - 1
             WHERE t.ctid = ANY (ARRAY(SELECT lk.tid FROM lk))
            RETURNING t.{{.Key}} AS k, t.stream_id, t.partition_number)
        SELECT array_agg(up.k), array_agg(up.stream_id) FILTER (WHERE up.stream_id <> ''),
               array_agg(up.partition_number) FILTER (WHERE up.stream_id <> '')
          INTO x_ids, x_streams, x_parts FROM up;
        IF x_ids IS NOT NULL THEN
            v_cat := v_cat || array_fill('{{.Name}}'::text, ARRAY[cardinality(x_ids)]);
            v_ids := v_ids || x_ids;
            {{- template "settleCollect" .}}
        END IF;
    END IF;
{{- end}}
    IF cardinality(v_streams) > 0 THEN
        PERFORM {{.S}}.wp_settle_streams(p_instance_id, v_streams, v_parts, v_scats);
    END IF;
    RETURN QUERY SELECT u.c, u.k FROM unnest(v_cat, v_ids) AS u(c, k);
END
$fn$;

-- wp_cleanup_stale_instances evicts instances whose last heartbeat is older
-- than now - p_stale_ns and whose alive-lock no session holds, and instances
-- older than now - p_dead_ns regardless of the lock (half-open peers). With
-- p_lock_lost_ns > 0 it also applies the lock-loss rule to instances whose
-- last heartbeat reported their lock held: the first sweep that finds the
-- lock missing notes the time (lock_missing_since), a sweep that finds it
-- held again clears the note, and a sweep that finds it still missing
-- p_lock_lost_ns or more after the note evicts the instance. (0 leaves notes
-- alone.) Evicted instances' leases and streams are released, every
-- surviving instance is NOTIFYed 'orphan', and the evicted ids are returned
-- in rank order. Instance rows a concurrent claim holds are skipped. Notes
-- are the only writes when nobody is evicted.
CREATE FUNCTION {{.S}}.wp_cleanup_stale_instances(
    p_stale_ns     bigint,
    p_dead_ns      bigint,
    p_now          timestamptz DEFAULT NULL,
    p_lock_lost_ns bigint DEFAULT 0)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := COALESCE(p_now, now());
    v_lost  boolean := COALESCE(p_lock_lost_ns, 0) > 0;
    v_stale timestamptz;
    v_dead  timestamptz;
    v_cand  uuid[];
    v_held  uuid[];
    v_gone  uuid[];
BEGIN
    IF p_stale_ns IS NULL OR p_stale_ns <= 0 OR p_dead_ns IS NULL OR p_dead_ns < p_stale_ns THEN
        RAISE EXCEPTION 'workpump: wp_cleanup_stale_instances: need 0 < p_stale_ns <= p_dead_ns' USING ERRCODE = '22023';
    END IF;
    IF p_lock_lost_ns < 0 THEN
        RAISE EXCEPTION 'workpump: wp_cleanup_stale_instances: p_lock_lost_ns is negative' USING ERRCODE = '22023';
    END IF;
    v_stale := v_now - {{.S}}.wp_ns(p_stale_ns);
    v_dead := v_now - {{.S}}.wp_ns(p_dead_ns);
    SELECT array_agg(i.instance_id) INTO v_cand
      FROM {{.S}}.wp_service_instances i
     WHERE i.last_heartbeat_at < v_stale OR (v_lost AND i.reported_alive_lock);
    IF v_cand IS NULL THEN
        RETURN;
    END IF;
    v_held := ARRAY(SELECT {{.S}}.wp_held_alive_locks(v_cand));
    WITH victims AS (
        SELECT i.instance_id
          FROM {{.S}}.wp_service_instances i
         WHERE i.instance_id = ANY (v_cand)
           AND (i.last_heartbeat_at < v_dead
                OR (i.last_heartbeat_at < v_stale AND NOT (i.instance_id = ANY (v_held)))
                OR (v_lost AND i.reported_alive_lock AND NOT (i.instance_id = ANY (v_held))
                    AND i.lock_missing_since IS NOT NULL
                    AND v_now >= i.lock_missing_since + {{.S}}.wp_ns(p_lock_lost_ns)))
         ORDER BY i.instance_id
           FOR UPDATE SKIP LOCKED),
    d AS (
        DELETE FROM {{.S}}.wp_service_instances i
         USING victims v
         WHERE i.instance_id = v.instance_id
        RETURNING i.instance_id)
    SELECT array_agg(d.instance_id ORDER BY d.instance_id) INTO v_gone FROM d;
    IF v_lost THEN
        -- Notes: the first sighting of a missing reported lock, and the
        -- end of a note once the lock is held again. Rows already in the
        -- right state are not touched (an idle probe writes nothing).
        UPDATE {{.S}}.wp_service_instances i
           SET lock_missing_since = CASE WHEN i.instance_id = ANY (v_held) THEN NULL ELSE v_now END
         WHERE i.instance_id = ANY (v_cand) AND i.reported_alive_lock
           AND NOT (i.instance_id = ANY (COALESCE(v_gone, '{}')))
           AND (CASE WHEN i.instance_id = ANY (v_held) THEN i.lock_missing_since IS NOT NULL
                     ELSE i.lock_missing_since IS NULL END);
    END IF;
    IF v_gone IS NULL THEN
        RETURN;
    END IF;
    PERFORM {{.S}}.wp_release_instances(v_gone);
    PERFORM pg_notify({{.S}}.wp_channel(i.instance_id), 'orphan')
       FROM {{.S}}.wp_service_instances i;
    RETURN QUERY SELECT unnest(v_gone);
END
$fn$;

-- wp_record_heartbeat upserts the instance row (started_at on first insert,
-- last_heartbeat_at = now, identity fields refreshed, the reported alive-lock
-- state stored and any lock-missing note cleared) and, only when another
-- instance is older than the stale cutoff or (with p_lock_lost_ns > 0) has
-- lost the lock it reported, runs wp_cleanup_stale_instances. Returns the
-- evicted ids. A first registration NOTIFYs the other instances 'ranks':
-- partitions moved between ranks, and rows announced to their former rank
-- owner are announced to no one else.
CREATE FUNCTION {{.S}}.wp_record_heartbeat(
    p_instance_id     uuid,
    p_service_name    text,
    p_host_name       text,
    p_process_id      integer,
    p_metadata        text,
    p_stale_ns        bigint,
    p_dead_ns         bigint,
    p_now             timestamptz DEFAULT NULL,
    p_alive_lock_held boolean DEFAULT false,
    p_lock_lost_ns    bigint DEFAULT 0)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := COALESCE(p_now, now());
    v_others uuid[];
    v_new    boolean;
BEGIN
    IF p_stale_ns IS NULL OR p_stale_ns <= 0 OR p_dead_ns IS NULL OR p_dead_ns < p_stale_ns THEN
        RAISE EXCEPTION 'workpump: wp_record_heartbeat: need 0 < p_stale_ns <= p_dead_ns' USING ERRCODE = '22023';
    END IF;
    IF p_lock_lost_ns < 0 THEN
        RAISE EXCEPTION 'workpump: wp_record_heartbeat: p_lock_lost_ns is negative' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{.S}}.wp_service_instances AS i
        (instance_id, service_name, host_name, process_id, metadata, started_at, last_heartbeat_at, reported_alive_lock)
    VALUES (p_instance_id, COALESCE(p_service_name, ''), COALESCE(p_host_name, ''), COALESCE(p_process_id, 0),
            COALESCE(NULLIF(p_metadata, ''), '{}')::json, v_now, v_now, COALESCE(p_alive_lock_held, false))
    ON CONFLICT (instance_id) DO UPDATE
       SET service_name = EXCLUDED.service_name, host_name = EXCLUDED.host_name,
           process_id = EXCLUDED.process_id, metadata = EXCLUDED.metadata,
           last_heartbeat_at = EXCLUDED.last_heartbeat_at,
           reported_alive_lock = EXCLUDED.reported_alive_lock, lock_missing_since = NULL
    RETURNING i.xmax = 0 INTO v_new; -- xmax is 0 on an inserted row, set on an updated one
    IF v_new THEN
        PERFORM pg_notify({{.S}}.wp_channel(i.instance_id), 'ranks')
           FROM {{.S}}.wp_service_instances i
          WHERE i.instance_id <> p_instance_id;
    END IF;
    IF EXISTS (SELECT 1 FROM {{.S}}.wp_service_instances i
                WHERE i.instance_id <> p_instance_id
                  AND i.last_heartbeat_at < v_now - {{.S}}.wp_ns(p_stale_ns)) THEN
        RETURN QUERY SELECT * FROM {{.S}}.wp_cleanup_stale_instances(p_stale_ns, p_dead_ns, v_now, p_lock_lost_ns);
        RETURN;
    END IF;
    IF COALESCE(p_lock_lost_ns, 0) > 0 THEN
        v_others := ARRAY(SELECT i.instance_id FROM {{.S}}.wp_service_instances i
                           WHERE i.instance_id <> p_instance_id AND i.reported_alive_lock);
        IF cardinality(v_others) > cardinality(ARRAY(SELECT {{.S}}.wp_held_alive_locks(v_others))) THEN
            RETURN QUERY SELECT * FROM {{.S}}.wp_cleanup_stale_instances(p_stale_ns, p_dead_ns, v_now, p_lock_lost_ns);
        END IF;
    END IF;
END
$fn$;

-- wp_deregister releases every lease and stream p_instance_id holds, deletes
-- its row and NOTIFYs the survivors 'orphan' (graceful shutdown). Returns
-- false when the instance was not registered (then nothing is changed).
CREATE FUNCTION {{.S}}.wp_deregister(p_instance_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
    DELETE FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {{.S}}.wp_release_instances(ARRAY[p_instance_id]);
    PERFORM pg_notify({{.S}}.wp_channel(i.instance_id), 'orphan')
       FROM {{.S}}.wp_service_instances i;
    RETURN true;
END
$fn$;

-- wp_purge removes history: processed rows (inbox dedupe records) processed
-- before now - p_processed_ns, dead letters older than now - p_dead_ns, and
-- stream ownership rows whose lease ended before now - p_streams_ns (released
-- streams have no lease and always qualify), with the idle lock rows of
-- unowned streams. A null or zero age skips that purge. Rows locked by an
-- open enqueue or claim are skipped.
CREATE FUNCTION {{.S}}.wp_purge(
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
        DELETE FROM {{.S}}.wp_dead_letters d WHERE d.dead_lettered_at < v_now - {{.S}}.wp_ns(p_dead_ns);
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

-- ---- Inspector functions (read-only) ----

-- wp_get_work returns one row of a category, processed rows included.
CREATE FUNCTION {{.S}}.wp_get_work(p_category text, p_id uuid)
RETURNS TABLE (
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
    instance_id      uuid,
    done_at          timestamptz,
    last_error       text)
LANGUAGE plpgsql STABLE
AS $fn$
#variable_conflict use_column
BEGIN
    IF p_category IS NULL OR p_category NOT IN ({{.CatList}}) THEN
        RAISE EXCEPTION 'workpump: wp_get_work: unknown category %', p_category USING ERRCODE = 'WP002';
    END IF;
{{- range .Cats}}
    IF p_category = '{{.Name}}' THEN
        RETURN QUERY
        SELECT t.{{.Key}}, t.stream_id, t.partition_number, t.name, t.message_type, t.payload, t.metadata, t.attempts,
               t.seq, t.scheduled_for, t.created_at, t.lease_expiry, t.instance_id, t.{{.Done}}, t.last_error
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Key}} = p_id;
    END IF;
{{- end}}
END
$fn$;

-- wp_instance_states lists the registered instances in rank order, with
-- whether their alive-lock is held right now and their lock-loss state.
CREATE FUNCTION {{.S}}.wp_instance_states()
RETURNS TABLE (
    instance_id         uuid,
    service_name        text,
    host_name           text,
    process_id          integer,
    metadata            json,
    started_at          timestamptz,
    last_heartbeat_at   timestamptz,
    alive_lock_held     boolean,
    reported_alive_lock boolean,
    lock_missing_since  timestamptz)
LANGUAGE sql VOLATILE
AS $fn$
    WITH ids AS (SELECT array_agg(i.instance_id) AS a FROM {{.S}}.wp_service_instances i),
    held AS (SELECT {{.S}}.wp_held_alive_locks(ids.a) AS instance_id FROM ids WHERE ids.a IS NOT NULL)
    SELECT i.instance_id, i.service_name, i.host_name, i.process_id, i.metadata, i.started_at, i.last_heartbeat_at,
           EXISTS (SELECT 1 FROM held h WHERE h.instance_id = i.instance_id),
           i.reported_alive_lock, i.lock_missing_since
      FROM {{.S}}.wp_service_instances i
     ORDER BY i.instance_id
$fn$;

-- wp_list_instances is wp_instance_states without the lock-loss columns
-- (the shape of the first drivers).
CREATE FUNCTION {{.S}}.wp_list_instances()
RETURNS TABLE (
    instance_id       uuid,
    service_name      text,
    host_name         text,
    process_id        integer,
    metadata          json,
    started_at        timestamptz,
    last_heartbeat_at timestamptz,
    alive_lock_held   boolean)
LANGUAGE sql VOLATILE
AS $fn$
    SELECT s.instance_id, s.service_name, s.host_name, s.process_id, s.metadata, s.started_at, s.last_heartbeat_at,
           s.alive_lock_held
      FROM {{.S}}.wp_instance_states() s
$fn$;

-- wp_list_dead_letters lists dead letters oldest first; p_limit <= 0 means all.
CREATE FUNCTION {{.S}}.wp_list_dead_letters(p_limit integer)
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
    error            text,
    dead_lettered_at timestamptz)
LANGUAGE sql STABLE
AS $fn$
    SELECT d.category, d.id, d.stream_id, d.partition_number, d.name, d.message_type, d.payload, d.metadata,
           d.attempts, d.seq, d.scheduled_for, d.created_at, d.error, d.dead_lettered_at
      FROM {{.S}}.wp_dead_letters d
     ORDER BY d.dead_lettered_at, d.dead_letter_id
     LIMIT CASE WHEN p_limit > 0 THEN p_limit END
$fn$;

-- wp_get_stream_owner returns a stream's ownership row (it exists once the
-- stream was claimed, until purged).
CREATE FUNCTION {{.S}}.wp_get_stream_owner(p_stream_id text)
RETURNS TABLE (assigned_instance_id uuid, lease_expiry timestamptz)
LANGUAGE sql STABLE
AS $fn$
    SELECT a.assigned_instance_id, a.lease_expiry
      FROM {{.S}}.wp_active_streams a
     WHERE a.stream_id = p_stream_id
$fn$;

-- wp_stats counts each category's rows at now: ready (due, unowned or
-- expired), scheduled (not due), leased (unexpired), orphaned (expired
-- lease), processed (kept).
CREATE FUNCTION {{.S}}.wp_stats(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (category text, ready bigint, scheduled bigint, leased bigint, orphaned bigint, processed bigint)
LANGUAGE sql STABLE
AS $fn$
{{- range $i, $c := .Cats}}{{if $i}}
    UNION ALL{{end}}
    SELECT '{{.Name}}'::text,
           count(*) FILTER (WHERE t.{{.Done}} IS NULL AND (t.scheduled_for IS NULL OR t.scheduled_for <= x.now)
                              AND (t.instance_id IS NULL OR t.lease_expiry < x.now)),
           count(*) FILTER (WHERE t.{{.Done}} IS NULL AND t.scheduled_for > x.now),
           count(*) FILTER (WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.lease_expiry >= x.now),
           count(*) FILTER (WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.lease_expiry < x.now),
           count(*) FILTER (WHERE t.{{.Done}} IS NOT NULL)
      FROM {{$.S}}.{{.Table}} t
     CROSS JOIN (SELECT COALESCE(p_now, now()) AS now) x
{{- end}}
$fn$;

-- wp_stats_leases counts unexpired leases per instance and category.
CREATE FUNCTION {{.S}}.wp_stats_leases(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (instance_id uuid, category text, leases bigint)
LANGUAGE sql STABLE
AS $fn$
{{- range $i, $c := .Cats}}{{if $i}}
    UNION ALL{{end}}
    SELECT t.instance_id, '{{.Name}}'::text, count(*)
      FROM {{$.S}}.{{.Table}} t
     WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.lease_expiry >= COALESCE(p_now, now())
     GROUP BY t.instance_id
{{- end}}
$fn$;
