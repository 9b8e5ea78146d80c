-- Reverts 0004_liveness.up.sql.
SELECT 1 FROM {{.S}}.wp_outbox LIMIT 0;
