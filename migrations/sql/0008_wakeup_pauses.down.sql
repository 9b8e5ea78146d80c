-- Reverts 0008_wakeup_pauses.up.sql: version 2's wp_wakeup_needed, without
-- pause points.

-- wp_wakeup_needed decides, inside an enqueue's transaction, whether it must
-- NOTIFY p_instance_id: not while the instance polls by itself. Before it
-- skips, the transaction takes the hand-shake lock shared (held until it
-- ends) and checks again, so the instance cannot finish ending its period
-- (which takes the hand-shake exclusively, then claims once more) before
-- this transaction's rows are committed or gone. While the instance runs
-- that last claim, enqueues notify.
CREATE OR REPLACE FUNCTION {{.S}}.wp_wakeup_needed(p_instance_id uuid) RETURNS boolean
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
