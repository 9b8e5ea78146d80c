-- Placeholder: filled in by the change that owns this version.
SELECT 1 FROM {{.S}}.wp_outbox LIMIT 0;
