-- Reverts 0005_partition_count.up.sql.
SELECT 1 FROM {{.S}}.wp_outbox LIMIT 0;
