-- Reverts 0001_tables.up.sql.
DROP TABLE IF EXISTS {{.S}}.wp_dead_letters;
DROP TABLE IF EXISTS {{.S}}.wp_stream_locks;
DROP TABLE IF EXISTS {{.S}}.wp_active_streams;
DROP TABLE IF EXISTS {{.S}}.wp_service_instances;
{{- range .Cats}}
DROP TABLE IF EXISTS {{$.S}}.{{.Table}};
{{- end}}
DROP FUNCTION IF EXISTS {{.S}}.wp_rank_key;
DROP SEQUENCE IF EXISTS {{.S}}.wp_work_seq;
