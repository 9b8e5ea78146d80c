-- Reverts 0011_cancel.up.sql.
DROP FUNCTION IF EXISTS {{.S}}.wp_cancel_work(text, uuid[], text, timestamptz);
