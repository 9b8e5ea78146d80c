-- workpump schema, version 8: the wake-up hand-shake has pause points.
--
-- wp_wakeup_needed decides as in version 2. Test sessions
-- (workpump.pause_points = on) can be held at its two steps, so a test can
-- end the instance's self-polling period in between and prove that no
-- enqueue that skips its NOTIFY is missed by the period's last claim:
--  * wakeup.after_check: the instance was seen polling by itself, and the
--    enqueue holds nothing yet;
--  * wakeup.after_handshake: the enqueue holds the hand-shake lock shared
--    and has not checked again;
--  * wakeup.skipped: it checked again and skips its NOTIFY; its rows are
--    written and not yet committed.
-- All are keyed by the target instance.

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
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('wakeup.after_check', p_instance_id);
    END IF;
    IF NOT pg_try_advisory_xact_lock_shared({{.S}}.wp_wake_lock_key(p_instance_id, 'handshake')) THEN
        RETURN true;
    END IF;
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('wakeup.after_handshake', p_instance_id);
    END IF;
    IF NOT {{.S}}.wp_polls_by_itself(p_instance_id) THEN
        RETURN true;
    END IF;
    IF current_setting('workpump.pause_points', true) = 'on' THEN
        PERFORM {{.S}}.wp_pause_point('wakeup.skipped', p_instance_id);
    END IF;
    RETURN false;
END
$fn$;
