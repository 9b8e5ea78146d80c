-- workpump schema, version 20: a claimed row is written to one index
-- fewer.
--
-- The leased rows were in two indexes: _wake (by lease expiry, beside the
-- scheduled rows by schedule) and _leased (by owner, for the release of a
-- departing instance's rows). A claim or a renewal wrote each row into
-- both. Now _wake carries the owner as its second key and _leased is gone.
-- _wake's first key and predicate are unchanged, so every statement that
-- reads it as before (a build older than this version, during a rolling
-- upgrade, too) still does.
--
-- A release (deregistration, eviction: wp_release_instances, below) finds
-- a departing instance's rows by testing that second key on _wake's
-- entries, without reading the other instances' rows or the waiting
-- retries from the table; the walk's cost follows the number of waiting
-- rows. A release of several instances at once walks the leased rows'
-- entries once and reads every leased row. It then locks the rows by key.
-- wp_stats_leases reads the leased rows through _wake too.
--
-- Each table's old indexes are dropped before its new _wake is built:
-- the drop takes the table's exclusive lock first, so reads and writes of
-- the table wait from then until the migration's transaction commits.
-- (Building first would take a lighter lock and then ask for the exclusive
-- one, and a pump that read the table meanwhile and then wrote it would
-- deadlock with the migration.)
{{range .Cats}}
DROP INDEX {{$.S}}.{{.Table}}_leased;
DROP INDEX {{$.S}}.{{.Table}}_wake;
CREATE INDEX {{.Table}}_wake ON {{$.S}}.{{.Table}}
    ((CASE WHEN instance_id IS NULL THEN scheduled_for ELSE lease_expiry END), instance_id)
    WHERE {{.Done}} IS NULL AND (instance_id IS NOT NULL OR scheduled_for IS NOT NULL);
{{- end}}

-- wp_release_instances (version 20: rows found on _wake) clears every
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

-- wp_stats_leases (version 20: scans off, so _wake serves it) counts
-- unexpired leases per instance and category.
CREATE OR REPLACE FUNCTION {{.S}}.wp_stats_leases(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (instance_id uuid, category text, leases bigint)
LANGUAGE sql STABLE
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
{{- range $i, $c := .Cats}}{{if $i}}
    UNION ALL{{end}}
    SELECT t.instance_id, '{{.Name}}'::text, count(*)
      FROM {{$.S}}.{{.Table}} t
     WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.lease_expiry >= COALESCE(p_now, now())
     GROUP BY t.instance_id
{{- end}}
$fn$;
