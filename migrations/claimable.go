package migrations

import (
	"fmt"
	"strings"
)

// ClaimableSQL renders a boolean SQL expression over two argument
// expressions of a wp_claim_work call (the instance id and p_now) whose
// categories argument names exactly cats: it is false only when that call
// would return no rows without raising, that is when the instance is
// registered and none of cats has a fresh row or a waiting row that is due
// (the function's own idle short-circuit). The drivers put it after the
// call as its WHERE clause, and pass cats as the call's categories:
//
//	SELECT * FROM s.wp_claim_work($1, $2, $3, $4, $5)
//	 WHERE <ClaimableSQL("s", "$1::uuid", "$5::timestamptz", "outbox")>  -- $2 = {outbox}
//
// Postgres evaluates such a clause, which does not depend on the function's
// rows, as a one-time filter before the function scan starts, so an idle
// claim is one plain statement of index probes (one for the instance, two
// per category): no PL/pgSQL call and no second statement inside it
// (BENCHMARKS.md, "Idle claim").
//
// The categories are part of the text, not a parameter, and the clause
// takes no parameter that could remove a probe: with a cached statement,
// Postgres plans the first five executions with the parameters' values and
// then keeps a generic plan only if it costs no more than those. A clause
// that tested a categories parameter would let the value-specific plans
// drop the probes of the categories not asked for, so every claim of fewer
// than all categories would be planned anew (about 0.5 ms here).
//
// The probes repeat the predicates of the _fresh and _wake partial indexes
// (0001_tables) and of wp_claim_work's own idle short-circuit, which stays
// for direct callers. Each is an ordered LIMIT 1 on its index's key: the
// plain statement cannot carry the functions' enable_seqscan = off, and an
// ordered probe keeps the index scan whatever the statistics say (a scan of
// the table would cost as much as sorting it). The categories, lease and
// batch-size arguments are not checked here; the drivers validate them
// first, and wp_claim_work raises for them whenever it runs. schema must be
// valid (ValidateSchema); it is quoted here. cats must be known categories
// (at least one; an unknown one panics, as a programming error).
func ClaimableSQL(schema, instance, now string, cats ...string) string {
	if len(cats) == 0 {
		panic("workpump migrations: ClaimableSQL needs at least one category")
	}
	s := `"` + schema + `"`
	t := "COALESCE(" + now + ", now())"
	var b strings.Builder
	// An unknown instance: let the function raise.
	b.WriteString("(NOT EXISTS (SELECT 1 FROM " + s + ".wp_service_instances i WHERE i.instance_id = " + instance + ")")
	for _, name := range cats {
		c, ok := categoryNamed(name)
		if !ok {
			panic(fmt.Sprintf("workpump migrations: ClaimableSQL: unknown category %q", name))
		}
		wake := "(CASE WHEN w.instance_id IS NULL THEN w.scheduled_for ELSE w.lease_expiry END)"
		b.WriteString(" OR EXISTS (SELECT 1 FROM " + s + "." + c.Table + " w" +
			" WHERE w." + c.Done + " IS NULL AND w.instance_id IS NULL AND w.scheduled_for IS NULL" +
			" ORDER BY w.seq LIMIT 1)" +
			" OR EXISTS (SELECT 1 FROM " + s + "." + c.Table + " w" +
			" WHERE w." + c.Done + " IS NULL AND (w.instance_id IS NOT NULL OR w.scheduled_for IS NOT NULL)" +
			" AND " + wake + " <= " + t +
			" ORDER BY " + wake + " LIMIT 1)")
	}
	b.WriteString(")")
	return b.String()
}

func categoryNamed(name string) (category, bool) {
	for _, c := range categories {
		if c.Name == name {
			return c, true
		}
	}
	return category{}, false
}
