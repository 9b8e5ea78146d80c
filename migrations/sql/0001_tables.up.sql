-- workpump schema, version 1: tables and indexes.
--
-- Rendered by migrations.Render (text/template; .S is the quoted schema
-- name, .Cats the four work categories). Every work
-- table has the same shape; the category decides the key column name, the
-- done column (receptor rows track completed_at, the others processed_at)
-- and whether the order scope includes name (perspective events).

CREATE SEQUENCE {{.S}}.wp_work_seq AS bigint;

-- wp_rank_key is a partition's low 15 bits in reverse order (each byte
-- reversed by the multiply-and-modulus trick, bytes swapped, the top bit
-- dropped). Claims route a row by partition mod live count (the caller's
-- rank). For a count 2^k (k <= 15) that residue is the key's top k bits, so
-- a rank's rows are one key range; for a count 2^k times 3, 5 or 15 it is
-- that range and one value of partition mod 3 and/or mod 5 (the residues
-- modulo coprime factors determine the one modulo their product). The fresh
-- index below carries all three, as smallints (its entries stay 24 bytes),
-- and btree tests them on its own entries, so a claim among 1-6, 8, 10, 12,
-- 15, 16, 20, ... instances fetches only its rank's rows from the heap.
-- (Other counts walk every rank's rows, as a plain seq index would.)
-- Immutable and inlined, so the index and the claim query share one
-- expression.
CREATE FUNCTION {{.S}}.wp_rank_key(p integer) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT (((((p & 255)::bigint * 8623620610) & 1136090292240) % 1023 << 7)
               | (((((p >> 8) & 127)::bigint * 8623620610) & 1136090292240) % 1023 >> 1))::smallint $fn$;

COMMENT ON SEQUENCE {{.S}}.wp_work_seq IS
    'workpump: enqueue order (Work.Seq) shared by all work tables. No CACHE: values must follow call order across sessions.';
{{range .Cats}}
CREATE TABLE {{$.S}}.{{.Table}} (
    {{.Key}}         uuid        PRIMARY KEY,
    seq              bigint      NOT NULL DEFAULT nextval('{{$.S}}.wp_work_seq'),
    stream_id        text        COLLATE "C" NOT NULL DEFAULT '',
    partition_number integer     NOT NULL CHECK (partition_number >= 0),
    name             text        COLLATE "C" NOT NULL DEFAULT '',
    message_type     text        NOT NULL DEFAULT '',
    payload          bytea,
    metadata         json        NOT NULL DEFAULT '{}',
    scheduled_for    timestamptz,
    created_at       timestamptz NOT NULL,
    instance_id      uuid,
    lease_expiry     timestamptz,
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    claim_count      integer     NOT NULL DEFAULT 0,
    last_error       text,
    {{.Done}}     timestamptz,
    CONSTRAINT {{.Table}}_lease_pair CHECK ((instance_id IS NULL) = (lease_expiry IS NULL)),
    -- A done row never holds a lease: fenced lookups by (key, attempts,
    -- instance) need no done test, which keeps them on the primary key.
    CONSTRAINT {{.Table}}_done_unleased CHECK ({{.Done}} IS NULL OR instance_id IS NULL)
);

COMMENT ON TABLE {{$.S}}.{{.Table}} IS 'workpump: {{.Name}} work ({{.NameMeaning}} in name)';

-- Claim sources. A pending row is either fresh (never leased since
-- enqueue or release, no schedule: claimable as soon as it routes to the
-- caller) or waiting for a time: its schedule when unleased, its lease
-- expiry when leased. The claim merges the fresh rows (in seq order) with
-- the waiting rows whose time has come, so its cost follows the rows it
-- looks at, not the backlog; the idle check is one probe into each index.
-- The fresh index's keys after seq let a claim skip other ranks' entries
-- without reading their rows (see wp_rank_key).
CREATE INDEX {{.Table}}_fresh ON {{$.S}}.{{.Table}}
    (seq, {{$.S}}.wp_rank_key(partition_number), ((partition_number % 3)::smallint), ((partition_number % 5)::smallint))
    WHERE {{.Done}} IS NULL AND instance_id IS NULL AND scheduled_for IS NULL;
CREATE INDEX {{.Table}}_wake ON {{$.S}}.{{.Table}}
    ((CASE WHEN instance_id IS NULL THEN scheduled_for ELSE lease_expiry END))
    WHERE {{.Done}} IS NULL AND (instance_id IS NOT NULL OR scheduled_for IS NOT NULL);
-- Rows that can block later rows of their order scope (leased, or carrying
-- a schedule). Fresh rows never block, so this index stays small.
CREATE INDEX {{.Table}}_blockers ON {{$.S}}.{{.Table}} (stream_id, {{if .ByName}}name, {{end}}seq)
    WHERE {{.Done}} IS NULL AND stream_id <> '' AND (instance_id IS NOT NULL OR scheduled_for IS NOT NULL);
{{- if .Keeps}}
-- Processed rows kept for deduplication, found by Purge.
CREATE INDEX {{.Table}}_done ON {{$.S}}.{{.Table}} ({{.Done}})
    WHERE {{.Done}} IS NOT NULL;
{{- end}}
{{end}}
CREATE TABLE {{.S}}.wp_service_instances (
    instance_id       uuid        PRIMARY KEY,
    service_name      text        NOT NULL DEFAULT '',
    host_name         text        NOT NULL DEFAULT '',
    process_id        integer     NOT NULL DEFAULT 0,
    metadata          json        NOT NULL DEFAULT '{}',
    started_at        timestamptz NOT NULL,
    last_heartbeat_at timestamptz NOT NULL,
    -- What the last heartbeat said about the instance's alive-lock, and when
    -- a lock-loss sweep first saw that lock missing (driver.CleanupRequest.
    -- LockLostAfter): only an instance that vouched for its lock can be
    -- evicted for losing it.
    reported_alive_lock boolean   NOT NULL DEFAULT false,
    lock_missing_since timestamptz
);

COMMENT ON TABLE {{.S}}.wp_service_instances IS
    'workpump: registered (live) pump instances; rank = position by instance_id';

-- One row per claimed stream: its owner and stream lease, shared by every
-- category. A stream whose owner settled its last row loses its row
-- (wp_settle_streams deletes it); streams released by cleanup or deregister
-- keep an ownerless row until purged.
CREATE TABLE {{.S}}.wp_active_streams (
    stream_id            text        COLLATE "C" PRIMARY KEY,
    assigned_instance_id uuid,
    lease_expiry         timestamptz,
    -- The stream's partition, as its rows carry it: a claim tells from it
    -- which streams are owned outside their owner's rank (NULL: unknown,
    -- counted as outside).
    partition_number     integer,
    CONSTRAINT wp_active_streams_lease_pair CHECK ((assigned_instance_id IS NULL) = (lease_expiry IS NULL))
);

-- No index on assigned_instance_id: claims and renewals rewrite these rows
-- constantly, and the table holds only the streams in flight (settled rows
-- are deleted), so the rare by-owner scans (cleanup, deregister) read it
-- whole instead.

COMMENT ON TABLE {{.S}}.wp_active_streams IS 'workpump: stream ownership (stream leases)';

-- One lock row per stream, never updated (so locking it never causes a
-- serialization failure in a REPEATABLE READ caller). Enqueue locks the rows
-- of its streams FOR NO KEY UPDATE until the caller commits, so enqueues of
-- one stream are serialized and commit in seq order; ClaimWork locks them
-- FOR UPDATE SKIP LOCKED before it takes rows of a stream, so it never
-- interleaves with an open enqueue or another claim of the same stream.
-- The rows carry no state: Purge deletes unlocked ones, and the next
-- enqueue or claim of the stream creates its row again.
CREATE TABLE {{.S}}.wp_stream_locks (
    stream_id text COLLATE "C" PRIMARY KEY
);

COMMENT ON TABLE {{.S}}.wp_stream_locks IS 'workpump: per-stream lock rows (enqueue/claim serialization)';

CREATE TABLE {{.S}}.wp_dead_letters (
    dead_letter_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    category         text        NOT NULL,
    id               uuid        NOT NULL,
    stream_id        text        COLLATE "C" NOT NULL,
    partition_number integer     NOT NULL,
    name             text        COLLATE "C" NOT NULL,
    message_type     text        NOT NULL,
    payload          bytea,
    metadata         json        NOT NULL,
    attempts         integer     NOT NULL,
    seq              bigint      NOT NULL,
    scheduled_for    timestamptz,
    created_at       timestamptz NOT NULL,
    instance_id      uuid,
    error            text        NOT NULL,
    dead_lettered_at timestamptz NOT NULL
);

CREATE INDEX wp_dead_letters_at ON {{.S}}.wp_dead_letters (dead_lettered_at);
CREATE INDEX wp_dead_letters_id ON {{.S}}.wp_dead_letters (category, id);

COMMENT ON TABLE {{.S}}.wp_dead_letters IS 'workpump: rows that failed MaxAttempts times';
