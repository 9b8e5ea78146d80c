-- Reverts 0003_claim_order.up.sql.
SELECT 1 FROM {{.S}}.wp_outbox LIMIT 0;
