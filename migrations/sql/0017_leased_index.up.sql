-- workpump schema, version 17: an instance's leased rows have an index of
-- their own.
--
-- Deregistration and eviction (wp_release_instances) found the departing
-- instance's rows among every leased or scheduled row, reading each one
-- from the table, so a stop cost time in proportion to what the other
-- instances held and to the retries waiting, not to what the departing
-- instance held. With this index the release reads only its own rows.
-- Building it reads each work table once and holds off writes to that
-- table meanwhile, inside the migration's transaction; afterwards claims
-- and renewals write one more index entry per row.
{{range .Cats}}
CREATE INDEX {{.Table}}_leased ON {{$.S}}.{{.Table}} (instance_id)
    WHERE {{.Done}} IS NULL AND instance_id IS NOT NULL;
{{- end}}
