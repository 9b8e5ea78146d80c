-- Reverts 0005_partition_count.up.sql.
DROP FUNCTION {{.S}}.wp_partition_count(integer, timestamptz);
DROP TABLE {{.S}}.wp_settings;
