-- workpump schema, version 20: a claimed row is written to one index
-- fewer.
--
-- The leased rows were in two indexes: _wake (by lease expiry, beside the
-- scheduled rows by schedule) and _leased (by owner, for the release of a
-- departing instance's rows). A claim or a renewal wrote each row into
-- both. Now _wake carries the owner as its second key and _leased is
-- gone: a release (deregistration, eviction) finds the departing
-- instance's rows by testing that key on _wake's entries, without reading
-- the rows of the other instances or of the retries waiting from the
-- table, and locks them by key (wp_release_instances, below). _wake's first key and predicate
-- are unchanged, so every statement that reads it as before (a build
-- older than this version, during a rolling upgrade, too) still does.
--
-- Rebuilding _wake reads each work table and holds off writes to it
-- meanwhile, inside the migration's transaction.
{{range .Cats}}
DROP INDEX {{$.S}}.{{.Table}}_leased;
DROP INDEX {{$.S}}.{{.Table}}_wake;
CREATE INDEX {{.Table}}_wake ON {{$.S}}.{{.Table}}
    ((CASE WHEN instance_id IS NULL THEN scheduled_for ELSE lease_expiry END), instance_id)
    WHERE {{.Done}} IS NULL AND (instance_id IS NOT NULL OR scheduled_for IS NOT NULL);
{{- end}}

-- wp_release_instances (version 20: rows found on _wake) clears every lease and stream ownership held by
-- p_ids (attempts unchanged) and returns how many work rows it released.
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
BEGIN
{{- range .Cats}}
    -- The owners' rows are found on _wake, one walk of its entries per
    -- owner testing its second key (an array test there would read every
    -- waiting row from the table), and then locked by key: a row a renewal
    -- wrote meanwhile is still found, at its new version.
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
                          OFFSET 0) x))
           AND t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.instance_id = ANY (p_ids)
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
