-- workpump schema, version 4: liveness grace and eviction awareness.
--
-- A heartbeat declares how long its instance means to wait before the next
-- one (p_interval_ns, stored as heartbeat_interval_ns). The stale rule gives
-- each instance the later of the caller's stale cutoff and one and a half
-- declared intervals: an instance that beats slowly because its alive-lock
-- proves it alive is not evicted by a sweep that lands while its listener
-- reconnects (and the lock is briefly free). The dead cutoff still bounds
-- every instance.
--
-- A heartbeat that says its instance believes it is registered
-- (p_registered) but finds no row returns the caller's own id among the
-- evicted ids: the caller was evicted meanwhile and registers anew. A sweep
-- never evicts the caller, so its own id cannot mean anything else.

ALTER TABLE {{.S}}.wp_service_instances
    ADD COLUMN heartbeat_interval_ns bigint NOT NULL DEFAULT 0;

COMMENT ON COLUMN {{.S}}.wp_service_instances.heartbeat_interval_ns IS
    'workpump: heartbeat interval the last heartbeat declared (ns; 0: none): the stale rule waits 1.5 of it at least';

-- wp_cleanup_stale_instances evicts instances whose last heartbeat is older
-- than now - p_stale_ns and than one and a half of their declared heartbeat
-- interval, and whose alive-lock no session holds, and instances older than
-- now - p_dead_ns regardless of the lock and interval (half-open peers).
-- With p_lock_lost_ns > 0 it also applies the lock-loss rule to instances
-- whose last heartbeat reported their lock held: the first sweep that finds
-- the lock missing notes the time (lock_missing_since), a sweep that finds
-- it held again clears the note, and a sweep that finds it still missing
-- p_lock_lost_ns or more after the note evicts the instance. (0 leaves notes
-- alone.) Evicted instances' leases and streams are released, every
-- surviving instance is NOTIFYed 'orphan', and the evicted ids are returned
-- in rank order. Instance rows a concurrent claim holds are skipped. Notes
-- are the only writes when nobody is evicted.
CREATE OR REPLACE FUNCTION {{.S}}.wp_cleanup_stale_instances(
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
                OR (i.last_heartbeat_at < v_stale
                    -- The declared interval's grace, added to the heartbeat
                    -- in two steps: no duration arithmetic can overflow.
                    AND i.last_heartbeat_at + {{.S}}.wp_ns(i.heartbeat_interval_ns)
                        + {{.S}}.wp_ns(i.heartbeat_interval_ns / 2) < v_now
                    AND NOT (i.instance_id = ANY (v_held)))
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

-- Two parameters join wp_record_heartbeat, so the old signature goes: an
-- overload with fewer parameters would make older call texts ambiguous.
DROP FUNCTION {{.S}}.wp_record_heartbeat(uuid, text, text, integer, text, bigint, bigint, timestamptz, boolean, bigint);

-- wp_record_heartbeat upserts the instance row (started_at on first insert,
-- last_heartbeat_at = now, identity fields refreshed, the reported alive-lock
-- state and the declared heartbeat interval stored and any lock-missing note
-- cleared) and, only when another instance is older than the stale cutoff
-- or (with p_lock_lost_ns > 0) has lost the lock it reported, runs
-- wp_cleanup_stale_instances. Returns the evicted ids, and the caller's own
-- id when p_registered says it believed it was registered but it had no
-- row (it was evicted and is registered anew). A first registration
-- NOTIFYs the other instances 'ranks': partitions moved between ranks, and
-- rows announced to their former rank owner are announced to no one else.
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
    p_lock_lost_ns    bigint DEFAULT 0,
    p_registered      boolean DEFAULT false,
    p_interval_ns     bigint DEFAULT 0)
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
    IF p_interval_ns < 0 OR p_interval_ns > p_dead_ns THEN
        RAISE EXCEPTION 'workpump: wp_record_heartbeat: need 0 <= p_interval_ns <= p_dead_ns' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{.S}}.wp_service_instances AS i
        (instance_id, service_name, host_name, process_id, metadata, started_at, last_heartbeat_at, reported_alive_lock,
         heartbeat_interval_ns)
    VALUES (p_instance_id, COALESCE(p_service_name, ''), COALESCE(p_host_name, ''), COALESCE(p_process_id, 0),
            COALESCE(NULLIF(p_metadata, ''), '{}')::json, v_now, v_now, COALESCE(p_alive_lock_held, false),
            COALESCE(p_interval_ns, 0))
    ON CONFLICT (instance_id) DO UPDATE
       SET service_name = EXCLUDED.service_name, host_name = EXCLUDED.host_name,
           process_id = EXCLUDED.process_id, metadata = EXCLUDED.metadata,
           last_heartbeat_at = EXCLUDED.last_heartbeat_at,
           reported_alive_lock = EXCLUDED.reported_alive_lock, lock_missing_since = NULL,
           heartbeat_interval_ns = EXCLUDED.heartbeat_interval_ns
    RETURNING i.xmax = 0 INTO v_new; -- xmax is 0 on an inserted row, set on an updated one
    IF v_new THEN
        PERFORM pg_notify({{.S}}.wp_channel(i.instance_id), 'ranks')
           FROM {{.S}}.wp_service_instances i
          WHERE i.instance_id <> p_instance_id;
        IF COALESCE(p_registered, false) THEN
            RETURN NEXT p_instance_id;
        END IF;
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
