-- Reverts 0017_leased_index.up.sql: the leased rows' index is dropped.
{{range .Cats}}
DROP INDEX {{$.S}}.{{.Table}}_leased;
{{- end}}
