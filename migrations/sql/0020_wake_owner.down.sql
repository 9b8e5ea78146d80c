-- Reverts 0020_wake_owner.up.sql: _wake by wake time alone, the leased
-- rows' index by owner, wp_release_instances of version 6 and
-- wp_stats_leases of version 2.
-- (Each table's index is dropped before the ones replacing it are built,
-- as the up migration does.)
{{range .Cats}}
DROP INDEX {{$.S}}.{{.Table}}_wake;
CREATE INDEX {{.Table}}_wake ON {{$.S}}.{{.Table}}
    ((CASE WHEN instance_id IS NULL THEN scheduled_for ELSE lease_expiry END))
    WHERE {{.Done}} IS NULL AND (instance_id IS NOT NULL OR scheduled_for IS NOT NULL);
CREATE INDEX {{.Table}}_leased ON {{$.S}}.{{.Table}} (instance_id)
    WHERE {{.Done}} IS NULL AND instance_id IS NOT NULL;
{{- end}}

-- wp_release_instances (version 6) clears every lease and stream ownership held by
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
    v_tids := ARRAY(
        SELECT t.ctid
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.instance_id = ANY (p_ids)
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

-- wp_stats_leases (version 2) counts unexpired leases per instance and category.
CREATE OR REPLACE FUNCTION {{.S}}.wp_stats_leases(p_now timestamptz DEFAULT NULL)
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
