-- Version 17: a deregistration gives back the attempts of the running
-- leases it frees. A stopping pump has completed, failed or released every
-- row it knew of before it deregisters, so a row still leased to it under
-- a running lease is one it never ran: a claim the store committed but
-- whose answer the pump never read (its Stop's deadline cut the claim
-- off), or a release that failed. wp_deregister freed such rows with their
-- attempt spent, as an eviction does, so every such stop walked them
-- towards MaxAttempts; it now gives the attempt back, as wp_release does.
-- A lease that ran out keeps its attempt (its handler may have overrun
-- it), and so do evictions (wp_release_instances, called by the stale and
-- lock-loss rules): an instance that died may have run the row.

-- wp_deregister releases every lease p_instance_id holds, giving back the
-- attempt (attempts - 1) of those whose lease has not run out at now,
-- releases its streams, deletes its row and NOTIFYs the survivors 'orphan'
-- (graceful shutdown). Returns false when the instance was not registered
-- (then nothing is changed). Rows are locked in one statement and written
-- in the next (see wp_release_instances).
CREATE OR REPLACE FUNCTION {{.S}}.wp_deregister(p_instance_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := COALESCE(p_now, now());
    v_tids tid[];
BEGIN
    DELETE FROM {{.S}}.wp_service_instances i WHERE i.instance_id = p_instance_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
{{- range .Cats}}
    v_tids := ARRAY(
        SELECT t.ctid
          FROM {{$.S}}.{{.Table}} t
         WHERE t.{{.Done}} IS NULL AND t.instance_id IS NOT NULL AND t.instance_id = p_instance_id
         ORDER BY t.{{.Key}}
           FOR UPDATE);
    UPDATE {{$.S}}.{{.Table}} t
       SET instance_id = NULL, lease_expiry = NULL,
           attempts = CASE WHEN t.lease_expiry >= v_now THEN greatest(t.attempts - 1, 0) ELSE t.attempts END
     WHERE t.ctid = ANY (v_tids)
       AND t.instance_id = p_instance_id;
{{- end}}
    UPDATE {{.S}}.wp_active_streams a
       SET assigned_instance_id = NULL, lease_expiry = NULL
      FROM (SELECT s.stream_id FROM {{.S}}.wp_active_streams s
             WHERE s.assigned_instance_id = p_instance_id
             ORDER BY s.stream_id
               FOR NO KEY UPDATE) l
     WHERE a.stream_id = l.stream_id;
    PERFORM pg_notify({{.S}}.wp_channel(i.instance_id), 'orphan')
       FROM {{.S}}.wp_service_instances i;
    RETURN true;
END
$fn$;
