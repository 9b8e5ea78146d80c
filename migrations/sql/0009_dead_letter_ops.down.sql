-- Reverts 0009_dead_letter_ops.up.sql.
DROP FUNCTION IF EXISTS {{.S}}.wp_act_on_dead_letters(text, text, text, text, text, timestamptz, timestamptz, uuid[], boolean, timestamptz);
DROP FUNCTION IF EXISTS {{.S}}.wp_find_dead_letters(text, text, text, text, timestamptz, timestamptz, uuid[], bigint, integer);
