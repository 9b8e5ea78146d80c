-- Reverts 0017_deregister_gives_back.up.sql: wp_deregister is version 2's
-- again (the rows it frees keep their attempt spent).

-- wp_deregister releases every lease and stream p_instance_id holds, deletes
-- its row and NOTIFYs the survivors 'orphan' (graceful shutdown). Returns
-- false when the instance was not registered (then nothing is changed).
CREATE OR REPLACE FUNCTION {{.S}}.wp_deregister(p_instance_id uuid, p_now timestamptz DEFAULT NULL)
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
