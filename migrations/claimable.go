package migrations

import "strings"

// ClaimableSQL renders a boolean SQL expression over three argument
// expressions of a wp_claim_work call (the instance id, the categories and
// p_now) that is false only when that call would return no rows without
// raising: the instance is registered, the categories are known, and none
// of those asked for has a fresh row or a waiting row that is due (the
// function's own idle short-circuit). The drivers put it after the call as
// its WHERE clause:
//
//	SELECT * FROM s.wp_claim_work($1, $2, $3, $4, $5) WHERE <ClaimableSQL>
//
// Postgres evaluates such a clause, which does not depend on the function's
// rows, as a one-time filter before the function scan starts, so an idle
// claim is one plain statement of nine index probes: no PL/pgSQL call and
// no second statement inside it, about a third less server time than the
// same probes inside the function (BENCHMARKS.md, "Idle claim").
//
// The probes repeat the predicates of the _fresh and _wake partial indexes
// (0001_tables) and of wp_claim_work's own idle short-circuit, which stays
// for direct callers. Each is an ordered LIMIT 1 on its index's key: the
// plain statement cannot carry the functions' enable_seqscan = off, and an
// ordered probe keeps the index scan whatever the statistics say (a scan of
// the table would cost as much as sorting it). The lease and batch-size
// arguments are not checked here; the drivers validate them first, and
// wp_claim_work raises for them whenever it runs. schema must be valid
// (ValidateSchema); it is quoted here.
func ClaimableSQL(schema, instance, cats, now string) string {
	s := `"` + schema + `"`
	t := "COALESCE(" + now + ", now())"
	names := make([]string, len(categories))
	for i, c := range categories {
		names[i] = "'" + c.Name + "'"
	}
	var b strings.Builder
	// An unknown instance or category: let the function raise.
	b.WriteString("(NOT EXISTS (SELECT 1 FROM " + s + ".wp_service_instances i WHERE i.instance_id = " + instance + ")")
	b.WriteString(" OR NOT (COALESCE(" + cats + ", '{}') <@ ARRAY[" + strings.Join(names, ", ") + "]::text[])")
	for _, c := range categories {
		wake := "(CASE WHEN w.instance_id IS NULL THEN w.scheduled_for ELSE w.lease_expiry END)"
		b.WriteString(" OR ((COALESCE(cardinality(" + cats + "), 0) = 0 OR '" + c.Name + "' = ANY (" + cats + "))" +
			" AND (EXISTS (SELECT 1 FROM " + s + "." + c.Table + " w" +
			" WHERE w." + c.Done + " IS NULL AND w.instance_id IS NULL AND w.scheduled_for IS NULL" +
			" ORDER BY w.seq LIMIT 1)" +
			" OR EXISTS (SELECT 1 FROM " + s + "." + c.Table + " w" +
			" WHERE w." + c.Done + " IS NULL AND (w.instance_id IS NOT NULL OR w.scheduled_for IS NOT NULL)" +
			" AND " + wake + " <= " + t +
			" ORDER BY " + wake + " LIMIT 1)))")
	}
	b.WriteString(")")
	return b.String()
}
